package saga_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestTransitionMetricsCountCommittedWork: inside a consumer's handler (a
// write scope bound to the batch's wake set) transitions are counted once
// the batch commits, so a batch rolled back — and applied again, as the
// consumer's fast path does after a failure — counts them once, not twice.
// In a transaction of the caller's own they are counted at once, as before.
func TestTransitionMetricsCountCommittedWork(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	mp := metrictest.New(t)
	eng := b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Meter: mp} })
	starts := func() int64 { return mp.Sum(t, telemetry.MetricTransitions) }
	// startInHandler starts a saga as a consumer's handler would, and
	// keeps or discards the handler's scope as the consumer does after
	// success or failure.
	startInHandler := func(order string, keep bool) *txq.Wakes {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		wakes := txq.NewWakes(tx)
		sctx, scope := txq.WithScope(wakes.Attach(ctx), tx)
		scope.CommitsWith(wakes)
		_, created, err := eng.StartTx(sctx, tx, msg(msgPlaceOrder, order), envelope.Meta{MessageID: newID()})
		require.NoError(t, err)
		require.True(t, created)
		require.Zero(t, starts(), "nothing is counted before the commit")
		if !keep {
			scope.Discard(errors.New("a later handler of the batch failed"))
			return wakes
		}
		require.NoError(t, scope.Flush(sctx))
		scope.Keep()
		require.NoError(t, tx.Commit(ctx))
		return wakes
	}

	startInHandler("o-1", false) // rolled back
	require.Zero(t, starts())
	wakes := startInHandler("o-1", true) // applied again, committed
	require.Zero(t, starts(), "counted only once the consumer sends its after-commit work")
	require.NoError(t, wakes.Send(ctx, b.pool))
	require.EqualValues(t, 1, starts(), "the start that ran twice counts once")

	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := eng.StartTx(ctx, tx, msg(msgPlaceOrder, "o-2"), envelope.Meta{MessageID: newID()})
		return err
	}))
	require.EqualValues(t, 2, starts(), "in the caller's own transaction the start counts at once")
}

// latencies returns, per saga.step/saga.step.phase, the samples of
// saga.step.latency: their count and sum in seconds.
func latencies(t *testing.T, mp *metrictest.Provider) map[string][2]float64 {
	t.Helper()
	out := map[string][2]float64{}
	for _, p := range mp.Points(t, telemetry.MetricStepLatency) {
		step, _ := p.Attrs.Value(telemetry.KeySagaStep)
		phase, _ := p.Attrs.Value(telemetry.KeyStepPhase)
		out[step.AsString()+"/"+phase.AsString()] = [2]float64{p.Value, p.Sum}
	}
	return out
}

// TestStepLatencyIsTheRoundTrip: saga.step.latency is each step's round
// trip, from its command written to its reply applied, labelled by the
// reply's step: the first step (whose command the start sends) and the
// last one (whose reply sends nothing) included, a compensation's in its
// own phase, and a command resent after a timeout measured from the resend.
func TestStepLatencyIsTheRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	mp := metrictest.New(t)
	b.engine = b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Meter: mp} })
	ctx := context.Background()

	// o-1 runs every step; ScheduleShipping times out once and is resent.
	id := b.start(t, "o-1")
	b.clock.Advance(1500 * time.Millisecond)
	b.mustReply(t, id, msgInventoryReserved)
	b.clock.Advance(700 * time.Millisecond)
	b.mustReply(t, id, msgPaymentAuthorized)
	b.clock.Advance(stepTimeout + time.Second)
	fired, err := b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, fired)
	b.clock.Advance(200 * time.Millisecond)
	require.Equal(t, sagadef.StateCompleted, b.mustReply(t, id, msgShippingScheduled).State)

	// o-2's payment is declined: ReserveInventory is compensated.
	id2 := b.start(t, "o-2")
	b.mustReply(t, id2, msgInventoryReserved)
	b.clock.Advance(400 * time.Millisecond)
	b.mustReply(t, id2, msgPaymentDeclined)
	b.clock.Advance(300 * time.Millisecond)
	require.Equal(t, sagadef.StateFailed, b.mustReply(t, id2, msgInventoryReleased).State)

	got := latencies(t, mp)
	want := map[string][2]float64{
		"ReserveInventory/forward":      {2, 1.5},
		"AuthorizePayment/forward":      {2, 0.7 + 0.4},
		"ScheduleShipping/forward":      {1, 0.2},
		"ReserveInventory/compensation": {1, 0.3},
	}
	require.Len(t, got, len(want), "%v", got)
	for k, w := range want {
		require.Contains(t, got, k)
		require.Equal(t, w[0], got[k][0], "%s: samples", k)
		require.InDelta(t, w[1], got[k][1], 1e-6, "%s: seconds", k)
	}
}
