package outbox

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// TestPrune: published rows older than the cut are deleted with their sent
// records, in id order up to the first row published since; unpublished
// rows stay however old; a row being replayed is skipped; more rows than a
// batch are all deleted.
func TestPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 12, routedKey)
	rowID := map[string]int64{}
	rows, err := b.pool.Query(ctx, `SELECT message_id, id FROM saga_outbox`)
	require.NoError(t, err)
	var (
		mid string
		id  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&mid, &id}, func() error { rowID[mid] = id; return nil })
	require.NoError(t, err)

	now := time.Now()
	old, recent := now.Add(-2*time.Hour), now.Add(-time.Minute)
	publish := func(messageID string, at time.Time) {
		t.Helper()
		tag, err := b.pool.Exec(ctx, `WITH done AS (DELETE FROM saga_outbox_pending WHERE id = $1 RETURNING id, attempts)
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) SELECT id, $2, attempts + 1, 'test' FROM done`, rowID[messageID], at)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
	}
	for i, at := range []time.Time{old, old, old, old, old, recent, old, old, old} {
		publish(ids[i], at)
	}
	// ids[9] and ids[10] are never published; ids[11] is published long
	// ago and is being replayed while the pruning runs.
	publish(ids[11], old)
	remaining := func() []string {
		t.Helper()
		rows, err := b.pool.Query(ctx, `SELECT message_id FROM saga_outbox ORDER BY id`)
		require.NoError(t, err)
		left, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		var sent int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_sent s
WHERE NOT EXISTS (SELECT FROM saga_outbox o WHERE o.id = s.id)`).Scan(&sent))
		require.Zero(t, sent, "no sent record outlives its row")
		return left
	}

	n, err := Prune(ctx, b.pool, now.Add(-time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	require.Equal(t, ids[5:], remaining(), "the row published a minute ago holds back the older ones behind it")

	replay, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = replay.Rollback(ctx) }()
	_, err = replay.Exec(ctx, `SELECT id FROM saga_outbox WHERE message_id = $1 FOR UPDATE`, ids[11])
	require.NoError(t, err)
	n, err = Prune(ctx, b.pool, now)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	require.Equal(t, ids[9:], remaining(), "unpublished rows stay, the row under replay is skipped")
	require.NoError(t, replay.Rollback(ctx))

	// A sent record next to a pending row (a late settle recorded a
	// replayed row as sent): the row is not deleted.
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) VALUES ($1, $2, 1, 'late')`,
		rowID[ids[9]], old)
	require.NoError(t, err)
	n, err = Prune(ctx, b.pool, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, ids[9:11], remaining())
	_, err = b.pool.Exec(ctx, `DELETE FROM saga_outbox_sent WHERE id = $1`, rowID[ids[9]])
	require.NoError(t, err)

	// More than one statement's worth.
	_, err = b.pool.Exec(ctx, `
WITH o AS (
  INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
  SELECT 'bulk-' || g, 'x', 'k', 't', 1, '\x00', now() FROM generate_series(1, $1::int) g
  RETURNING id
)
SELECT count(*) FROM o`, pruneBatch+7)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `WITH done AS (DELETE FROM saga_outbox_pending p USING saga_outbox o
  WHERE o.id = p.id AND o.message_id LIKE 'bulk-%' RETURNING p.id, p.attempts)
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) SELECT id, $1, 1, 'test' FROM done`, old)
	require.NoError(t, err)
	// A sent record whose outbox row was deleted by hand sits at the head:
	// it is passed over, not a reason to stop.
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) VALUES (-1, $1, 1, 'orphan')`, old)
	require.NoError(t, err)
	n, err = Prune(ctx, b.pool, now)
	require.NoError(t, err)
	require.EqualValues(t, pruneBatch+7, n)
	_, err = b.pool.Exec(ctx, `DELETE FROM saga_outbox_sent WHERE id = -1`)
	require.NoError(t, err)
	require.Equal(t, ids[9:11], remaining())
}

// TestPruneLeavesARowReplayedMeanwhile: a replay that commits after the
// pruning statement read the row as published (it deleted the sent record
// and made the row pending) must not lose the row.
func TestPruneLeavesARowReplayedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 1, routedKey)
	_, err := b.pool.Exec(ctx, `WITH done AS (DELETE FROM saga_outbox_pending RETURNING id, attempts)
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) SELECT id, now() - interval '2 hours', 1, 'test' FROM done`)
	require.NoError(t, err)

	// The replay's change to the sent record is in flight when the pruning
	// statement starts; the statement waits on that record, then finds it
	// gone.
	replay, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = replay.Rollback(ctx) }()
	_, err = replay.Exec(ctx, `WITH sent AS (DELETE FROM saga_outbox_sent RETURNING id, attempts)
INSERT INTO saga_outbox_pending (id, attempts) SELECT id, attempts FROM sent`)
	require.NoError(t, err)
	pruned := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = Prune(ctx, b.pool, time.Now().Add(-time.Hour))
		pruned <- err
	}()
	testenv.WaitBlocked(t, b.pool, "%head AS%") // the pruning waits for the replay
	require.NoError(t, replay.Commit(ctx))
	require.NoError(t, <-pruned)
	require.Zero(t, n)
	var state struct {
		exists, pending bool
	}
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM saga_outbox WHERE message_id = $1),
  EXISTS (SELECT FROM saga_outbox_pending)`, ids[0]).Scan(&state.exists, &state.pending))
	require.True(t, state.exists, "the replayed row is kept")
	require.True(t, state.pending)
}

// TestRelayPrunes: a running relay deletes the rows published longer ago
// than KeepPublished, every PruneInterval, and keeps the others; with a
// negative KeepPublished it keeps them all.
func TestRelayPrunes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 6, routedKey)
	r, _ := startRelay(t, b, RelayConfig{KeepPublished: time.Hour, PruneInterval: 20 * time.Millisecond})
	waitUnpublished(t, ctx, b.pool, 0)
	_, err := b.pool.Exec(ctx, `UPDATE saga_outbox_sent SET published_at = now() - interval '2 hours'
WHERE id IN (SELECT id FROM saga_outbox WHERE message_id = ANY($1))`, ids[:4])
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Stats().Pruned == 4 }, 10*time.Second, 20*time.Millisecond,
		"the relay did not prune the rows published two hours ago")
	var left []string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT array_agg(message_id ORDER BY id) FROM saga_outbox_state`).Scan(&left))
	require.Equal(t, ids[4:], left)

	keeper, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, KeepPublished: -1})
	require.NoError(t, err)
	require.Negative(t, keeper.retention().Keep, "a negative KeepPublished must switch pruning off")
	defaults, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn})
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, defaults.retention().Keep)
	require.Equal(t, time.Minute, defaults.retention().Interval)
}
