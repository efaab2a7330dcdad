package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestConsumedCountsASplitBatchOnce: a batch that a handler broke is
// applied again one delivery at a time; its deliveries were received once
// and are counted once.
func TestConsumedCountsASplitBatchOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mp := metrictest.New(t)
	r := b.start(func(c *consumer.Config) {
		c.Concurrency, c.BatchSize = 1, 16
		c.Telemetry = telemetry.Providers{Meter: mp}
	}, nil)
	b.sendOneBatch(r, [2]string{"ok1", doOK}, [2]string{"close-tx", doCloseTx}, [2]string{"ok2", doOK})
	b.waitSettled("ok1", "done")
	b.waitSettled("close-tx", "park")
	b.waitSettled("ok2", "done")
	b.stop(r)
	_, fellBack := consumer.Paths(r.c)
	require.Zero(t, fellBack, "a broken transaction splits the batch; it does not fall back")

	require.EqualValues(t, 4, mp.Value(t, telemetry.MetricConsumed, nil), "the gate and the three notes, each once")
}

// TestReconnectsAreCounted: a consumer whose connection the broker drops
// starts a new session and counts it in saga.consumer.reconnects.
func TestReconnectsAreCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mp := metrictest.New(t)
	r := b.start(func(c *consumer.Config) { c.Telemetry = telemetry.Providers{Meter: mp} }, nil)
	b.send("before", doOK, nil)
	b.waitSettled("before", "done")
	require.Zero(t, mp.Value(t, telemetry.MetricConsumerRestarts, nil))

	require.Positive(t, testenv.KillAMQPConnections(t, b.amqpURL))
	b.send("after", doOK, nil)
	b.waitSettled("after", "done")
	b.stop(r)
	require.GreaterOrEqual(t, mp.Value(t, telemetry.MetricConsumerRestarts, nil), 1.0)
}
