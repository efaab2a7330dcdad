package outbox

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// TestRepublish: a published row is released and published again with the
// same message id (no second row); an unknown message id is enqueued.
func TestRepublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	deliveries, err := b.ch.Consume(testQueue, "", true, false, false, false, nil)
	require.NoError(t, err)
	receive := func() string {
		select {
		case d := <-deliveries:
			return d.MessageId
		case <-ctx.Done():
			t.Fatal("no delivery")
			return ""
		}
	}

	ids := enqueue(t, ctx, b.pool, 1, routedKey)
	startRelay(t, b, RelayConfig{})
	require.Equal(t, ids[0], receive())
	waitUnpublished(t, ctx, b.pool, 0)

	// A published message: released and sent again, same id, one row.
	published := env(routedKey)
	published.MessageID = ids[0]
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, published) }))
	require.Equal(t, ids[0], receive(), "the replay keeps the message id")
	var rows int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE message_id = $1`, ids[0]).Scan(&rows))
	require.Equal(t, 1, rows, "released, not copied")

	// A message this outbox never held (parked from elsewhere): enqueued.
	foreign := env(routedKey)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, foreign) }))
	require.Equal(t, foreign.MessageID, receive())
	waitUnpublished(t, ctx, b.pool, 0)
}

// TestRepublishWaitsForASettleInFlight: a relay's settle has recorded a
// row as sent but not committed when an operator replays the message. The
// replay must wait for it and then release the row again, not take the row
// for pending and leave it sent.
func TestRepublishWaitsForASettleInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 1, routedKey)

	settle, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = settle.Rollback(ctx) }()
	var rowID int64
	require.NoError(t, settle.QueryRow(ctx, `SELECT id FROM saga_outbox WHERE message_id = $1`, ids[0]).Scan(&rowID))
	var marked, released int64
	require.NoError(t, settle.QueryRow(ctx, settleSQL, []int64{rowID}, []int64{}, []int64{}, []int32{}, "relay").Scan(&marked, &released))
	require.EqualValues(t, 1, marked)

	replayed := make(chan error, 1)
	go func() {
		e := env(routedKey)
		e.MessageID = ids[0]
		replayed <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, e) })
	}()
	testenv.WaitBlocked(t, b.pool, "%saga_outbox_pending%") // the replay waits for the settle
	require.NoError(t, settle.Commit(ctx))
	require.NoError(t, <-replayed)

	var pending, sent bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pending, published_at IS NOT NULL FROM saga_outbox_state WHERE id = $1`, rowID).
		Scan(&pending, &sent))
	require.True(t, pending, "the replay made the row pending again")
	require.False(t, sent)
}
