package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/schema"
)

type testBundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T) (context.Context, *testBundle) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	return ctx, &testBundle{pool: pool}
}

// claim runs Claim in its own transaction and commits it.
func claim(ctx context.Context, t *testing.T, pool *pgxpool.Pool, consumer, id string) bool {
	t.Helper()
	var first bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		first, err = inbox.Claim(ctx, tx, consumer, id)
		return err
	})
	require.NoError(t, err)
	return first
}

func countClaims(ctx context.Context, t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_inbox`).Scan(&n))
	return n
}

func TestClaim(t *testing.T) {
	t.Parallel()

	t.Run("FirstThenDuplicate", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		require.True(t, claim(ctx, t, b.pool, "orders", "m1"))
		require.False(t, claim(ctx, t, b.pool, "orders", "m1"))
		require.True(t, claim(ctx, t, b.pool, "orders", "m2"))
		require.Equal(t, 2, countClaims(ctx, t, b.pool))
	})

	t.Run("ConsumersAreIndependent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		require.True(t, claim(ctx, t, b.pool, "orders", "m1"))
		require.True(t, claim(ctx, t, b.pool, "billing", "m1"))
		require.False(t, claim(ctx, t, b.pool, "billing", "m1"))
	})

	t.Run("RollbackLeavesNoClaim", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		first, err := inbox.Claim(ctx, tx, "orders", "m1")
		require.NoError(t, err)
		require.True(t, first)
		require.NoError(t, tx.Rollback(ctx))
		require.True(t, claim(ctx, t, b.pool, "orders", "m1"))
	})

	t.Run("SavepointRollbackLeavesNoClaim", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		first, err := inbox.Claim(ctx, sp, "orders", "bad")
		require.NoError(t, err)
		require.True(t, first)
		require.NoError(t, sp.Rollback(ctx))
		sp, err = tx.Begin(ctx)
		require.NoError(t, err)
		first, err = inbox.Claim(ctx, sp, "orders", "good")
		require.NoError(t, err)
		require.True(t, first)
		require.NoError(t, sp.Commit(ctx))
		require.NoError(t, tx.Commit(ctx))

		require.True(t, claim(ctx, t, b.pool, "orders", "bad"))
		require.False(t, claim(ctx, t, b.pool, "orders", "good"))
	})

	t.Run("ConcurrentClaimsSerialize", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)

		for _, commitFirst := range []bool{true, false} {
			id := "commit"
			if !commitFirst {
				id = "rollback"
			}
			tx1, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			first, err := inbox.Claim(ctx, tx1, "orders", id)
			require.NoError(t, err)
			require.True(t, first)

			type result struct {
				first bool
				err   error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					var err error
					r.first, err = inbox.Claim(ctx, tx, "orders", id)
					return err
				})
				done <- r
			}()

			// Wait until the second claim is blocked on the first one's row lock.
			testenv.WaitBlocked(t, b.pool, "INSERT INTO saga_inbox%")

			if commitFirst {
				require.NoError(t, tx1.Commit(ctx))
			} else {
				require.NoError(t, tx1.Rollback(ctx))
			}
			r := <-done
			require.NoError(t, r.err)
			// After a commit the second claim is a duplicate; after a rollback
			// it takes the claim itself.
			require.Equal(t, !commitFirst, r.first)
		}
		require.Equal(t, 2, countClaims(ctx, t, b.pool))
	})

	t.Run("RejectsEmptyNames", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := inbox.Claim(ctx, tx, "", "m1")
			return err
		})
		require.ErrorContains(t, err, "empty consumer name")
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := inbox.Claim(ctx, tx, "orders", "")
			return err
		})
		require.ErrorContains(t, err, "empty message id")
		require.Equal(t, 0, countClaims(ctx, t, b.pool))
	})
}

func TestPrune(t *testing.T) {
	t.Parallel()

	ctx, b := setup(t)
	now := time.Now()
	// More old rows than one batch, so pruning must loop.
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
		SELECT 'orders', 'old-' || i, $1::timestamptz FROM generate_series(1, 12000) AS i`, now.Add(-48*time.Hour))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
		SELECT 'orders', 'new-' || i, $1::timestamptz FROM generate_series(1, 3) AS i`, now)
	require.NoError(t, err)

	n, err := inbox.Prune(ctx, b.pool, now.Add(-24*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 12000, n)
	require.Equal(t, 3, countClaims(ctx, t, b.pool))

	// Pruned claims can be taken again; kept ones still dedupe.
	require.True(t, claim(ctx, t, b.pool, "orders", "old-1"))
	require.False(t, claim(ctx, t, b.pool, "orders", "new-1"))

	n, err = inbox.Prune(ctx, b.pool, now.Add(-24*time.Hour))
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestPruneConsumer: only the named consumer's old claims go, however many
// batches they take; other consumers' claims stay, old or not.
func TestPruneConsumer(t *testing.T) {
	t.Parallel()

	ctx, b := setup(t)
	now := time.Now()
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
		SELECT c, 'old-' || i, $1::timestamptz FROM generate_series(1, 12000) AS i, unnest(ARRAY['orders', 'billing']) AS c`,
		now.Add(-48*time.Hour))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
		SELECT 'orders', 'new-' || i, $1::timestamptz FROM generate_series(1, 3) AS i`, now)
	require.NoError(t, err)

	n, err := inbox.PruneConsumer(ctx, b.pool, "orders", now.Add(-24*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 12000, n)
	var orders, billing int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE consumer = 'orders'),
  count(*) FILTER (WHERE consumer = 'billing') FROM saga_inbox`).Scan(&orders, &billing))
	require.Equal(t, 3, orders)
	require.Equal(t, 12000, billing, "another consumer's claims were pruned")
	require.True(t, claim(ctx, t, b.pool, "orders", "old-1"))
	require.False(t, claim(ctx, t, b.pool, "billing", "old-1"))
}

func TestClaimAll(t *testing.T) {
	t.Parallel()

	claimAll := func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, consumer string, ids ...string) []bool {
		t.Helper()
		var first []bool
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			first, err = inbox.ClaimAll(ctx, tx, consumer, ids)
			return err
		}))
		return first
	}

	t.Run("FirstOnlyAtFirstPositionAndOnlyOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		require.True(t, claim(ctx, t, b.pool, "orders", "m2"))
		got := claimAll(ctx, t, b.pool, "orders", "m3", "m1", "m2", "m3", "m4")
		require.Equal(t, []bool{true, true, false, false, true}, got)
		require.Equal(t, []bool{false, false}, claimAll(ctx, t, b.pool, "orders", "m1", "m4"))
		require.Equal(t, []bool{true}, claimAll(ctx, t, b.pool, "billing", "m1"), "consumers claim independently")
		require.Equal(t, 5, countClaims(ctx, t, b.pool))
	})

	t.Run("RolledBackClaimsAreForgotten", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		first, err := inbox.ClaimAll(ctx, tx, "orders", []string{"a", "b"})
		require.NoError(t, err)
		require.Equal(t, []bool{true, true}, first)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, []bool{true, true}, claimAll(ctx, t, b.pool, "orders", "b", "a"))
	})

	t.Run("WaitsForAConcurrentClaim", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = inbox.ClaimAll(ctx, tx, "orders", []string{"x"})
		require.NoError(t, err)
		done := make(chan []bool)
		go func() {
			var first []bool
			_ = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				first, err = inbox.ClaimAll(ctx, tx, "orders", []string{"y", "x"})
				return err
			})
			done <- first
		}()
		select {
		case got := <-done:
			t.Fatalf("claim did not wait for the open transaction: %v", got)
		case <-time.After(200 * time.Millisecond):
		}
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, []bool{true, false}, <-done)
	})

	t.Run("RejectsEmptyNames", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = inbox.ClaimAll(ctx, tx, "", []string{"a"})
		require.ErrorContains(t, err, "empty consumer name")
		_, err = inbox.ClaimAll(ctx, tx, "orders", []string{"a", ""})
		require.ErrorContains(t, err, "empty message id at position 1")
		first, err := inbox.ClaimAll(ctx, tx, "orders", nil)
		require.NoError(t, err)
		require.Empty(t, first)
	})
}

// TestClaimed: Claimed and QueueClaimed name exactly the ids the consumer
// has claimed, committed or earlier in the same transaction, and write
// nothing.
func TestClaimed(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t)
	require.True(t, claim(ctx, t, b.pool, "orders", "m1"))
	require.True(t, claim(ctx, t, b.pool, "billing", "m2"))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	first, err := inbox.Claim(ctx, tx, "orders", "m3")
	require.NoError(t, err)
	require.True(t, first)

	got, err := inbox.Claimed(ctx, tx, "orders", []string{"m1", "m2", "m3", "m4"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"m1": true, "m3": true}, got, "m2 is another consumer's; m4 nobody's")

	queued := map[string]bool{}
	var batch pgx.Batch
	inbox.QueueClaimed(&batch, "billing", []string{"m1", "m2"}, queued)
	require.NoError(t, tx.SendBatch(ctx, &batch).Close())
	require.Equal(t, map[string]bool{"m2": true}, queued)

	none, err := inbox.Claimed(ctx, tx, "orders", nil)
	require.NoError(t, err)
	require.Empty(t, none)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 2, countClaims(ctx, t, b.pool), "reading claims wrote none; the rolled-back claim is gone")
}
