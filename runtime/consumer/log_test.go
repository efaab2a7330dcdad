package consumer_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestFailureLogsCarryTheDeliveryIds: the records of a delivery's failure
// (its handler's panic, its retry, its parking) are logged with the
// delivery's context, so telemetry.NewLogHandler gives them its saga,
// correlation and causation ids. Its retries and parking are counted with
// the reason panic.
func TestFailureLogsCarryTheDeliveryIds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var out testenv.LogBuffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&out, nil), telemetry.LogOptions{}))
	mp := metrictest.New(t)
	r := b.start(func(c *consumer.Config) { c.Logger, c.Telemetry = logger, telemetry.Providers{Meter: mp} }, nil)
	b.send("p1", doPanic, nil)
	b.waitSettled("p1", "park")
	b.stop(r)

	for msg, n := range map[string]int{"handler panicked": 3, "message failed; retrying after a delay": 2, "message parked": 1} {
		recs := out.Records(t, msg)
		require.Len(t, recs, n, msg)
		for _, rec := range recs {
			require.Equal(t, "p1", rec["message_id"], msg)
			require.Equal(t, "saga-p1", rec["saga_id"], msg)
			require.Equal(t, "saga-p1", rec["correlation_id"], msg)
		}
	}
	require.Equal(t, 2.0, mp.Value(t, telemetry.MetricConsumerRetries, map[string]string{"saga.retry.reason": "panic"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricConsumerParked, map[string]string{
		"saga.park.class": "exhausted", "saga.park.reason": "panic"}))
}

// TestEarlyMessageRetriesAtInfo: a message marked retry.Early (it came
// before what it waits for) is retried like a transient failure, logged at
// INFO with the delivery's ids, never at WARN, and then handled.
func TestEarlyMessageRetriesAtInfo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var out testenv.LogBuffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&out, nil), telemetry.LogOptions{}))
	r := b.start(func(c *consumer.Config) { c.Logger = logger }, nil)
	b.send("e1", doEarly, nil)
	b.waitSettled("e1", "retry")
	b.waitSettled("e1", "done")
	b.stop(r)

	recs := out.Records(t, "message arrived before what it waits for; retrying after a delay")
	require.Len(t, recs, 1)
	require.Equal(t, "INFO", recs[0]["level"])
	require.Equal(t, "e1", recs[0]["message_id"])
	require.Equal(t, "saga-e1", recs[0]["saga_id"])
	require.Contains(t, recs[0]["reason"], "step not reached yet")
	require.Empty(t, out.Records(t, "message failed; retrying after a delay"))
	require.Empty(t, out.Records(t, "message parked"))
}
