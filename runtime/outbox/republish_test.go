package outbox

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
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
