package saga_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/saga"
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
