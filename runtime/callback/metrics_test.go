package callback_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/telemetry"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mp := metrictest.New(t)
	ok := newReceiver(t, nil)
	gone := newReceiver(t, func(_ int, w http.ResponseWriter) bool {
		w.WriteHeader(http.StatusGone)
		return false
	})
	// Pending before any dispatcher runs: the backlog gauges see it.
	early := b.enqueue(t, ok.srv.URL)
	cfg := b.config()
	cfg.Telemetry = telemetry.Providers{Meter: mp}
	d, err := callback.NewDispatcher(cfg)
	require.NoError(t, err)
	require.Equal(t, float64(1), mp.Value(t, callback.MetricPending, nil))
	require.Positive(t, mp.Value(t, callback.MetricOldestAge, nil))
	require.NoError(t, d.Close())

	b.run(t, cfg)
	b.waitStatus(t, early, callback.StatusDelivered)
	parked := b.enqueue(t, gone.srv.URL)
	b.waitStatus(t, parked, callback.StatusParked)

	ev := map[string]string{"saga.callback.event": "saga.completed"}
	require.Equal(t, float64(1), mp.Value(t, callback.MetricDelivered, ev))
	require.Equal(t, float64(1), mp.Value(t, callback.MetricParked, ev))
	require.Equal(t, float64(1), mp.Value(t, callback.MetricFailed, map[string]string{"saga.callback.event": "saga.completed", "error.type": "410"}))
	require.Equal(t, float64(2), mp.Value(t, callback.MetricLatency, ev), "two requests timed")
	require.Zero(t, mp.Value(t, callback.MetricPending, nil))
	require.Zero(t, mp.Value(t, callback.MetricOldestAge, nil))
}
