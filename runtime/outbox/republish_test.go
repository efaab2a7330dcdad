package outbox

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

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
	require.NoError(t, b.pool.QueryRow(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'relay', lease_until = now() + interval '1 minute', attempts = 1
WHERE id = (SELECT id FROM saga_outbox WHERE message_id = $1) RETURNING id`, ids[0]).Scan(&rowID))
	require.EqualValues(t, 1, settleRows(t, settle, "relay", rowID, 1))

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

// TestRepublishBeforeTheSettle: a relay has published a row and the broker
// confirmed it, but its settle has not run yet, when an operator replays the
// message (its first copy was parked meanwhile). The settle must not record
// the replay as sent: the row stays pending, claimable at once.
func TestRepublishBeforeTheSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 1, routedKey)
	var rowID int64
	require.NoError(t, b.pool.QueryRow(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'relay', lease_until = now() + interval '1 minute', attempts = 1
WHERE id = (SELECT id FROM saga_outbox WHERE message_id = $1) RETURNING id`, ids[0]).Scan(&rowID))

	since := func() (at time.Time) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT pending_since FROM saga_outbox_pending WHERE id = $1`, rowID).Scan(&at))
		return at
	}
	waiting := since()

	e := env(routedKey)
	e.MessageID = ids[0]
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, e) }))
	require.Zero(t, settleRows(t, b.pool, "relay", rowID, 1), "the settle of the publish before the replay recorded the replay")
	require.True(t, waiting.Equal(since()), "the replay of a row still pending hid how long it has waited")

	var pending bool
	var owner *string
	var leasedUntil *time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pending, lease_owner, lease_until FROM saga_outbox_state WHERE id = $1`, rowID).
		Scan(&pending, &owner, &leasedUntil))
	require.True(t, pending, "the replay is not published")
	require.Nil(t, owner)
	require.Nil(t, leasedUntil)
}

// settleRows runs the relay's settle for one row published under the claim
// (owner, attempts) and returns how many rows it recorded as sent.
func settleRows(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, owner string, id int64, attempts int32) int64 {
	t.Helper()
	var marked, released int64
	require.NoError(t, q.QueryRow(testCtx(t), settleDoneSQL, []int64{id}, []int32{attempts}, owner).
		Scan(&marked, &released))
	return marked
}

// TestLateSettleLeavesAReplay: a relay publishes a row, its lease runs out
// before it settles, another relay claims the row again, publishes it and
// records it, and an operator replays the message. The first relay's late
// settle must then leave the replayed row pending, so the replay is
// published; nor may a settle record a row claimed again since its claim.
// A relay taken for dead, whose lease was cleared but whose row nobody
// claimed again, still records what it published.
func TestLateSettleLeavesAReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	ids := enqueue(t, ctx, b.pool, 3, routedKey)
	rowID := func(messageID string) (id int64) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM saga_outbox WHERE message_id = $1`, messageID).Scan(&id))
		return id
	}
	claimAs := func(owner string, id int64) (attempts int32) {
		require.NoError(t, b.pool.QueryRow(ctx, `UPDATE saga_outbox_pending
SET lease_owner = $1, lease_until = now() + interval '1 minute', attempts = attempts + 1
WHERE id = $2 RETURNING attempts`, owner, id).Scan(&attempts))
		return attempts
	}
	state := func(id int64) (pending bool, owner *string, sentBy *string) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT pending, lease_owner, published_by FROM saga_outbox_state WHERE id = $1`, id).
			Scan(&pending, &owner, &sentBy))
		return
	}

	replayed := rowID(ids[0])
	slow := claimAs("slow", replayed)
	fast := claimAs("fast", replayed) // after slow's lease ran out
	require.EqualValues(t, 1, settleRows(t, b.pool, "fast", replayed, fast))
	e := env(routedKey)
	e.MessageID = ids[0]
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, e) }))
	var logs bytes.Buffer
	slowRelay, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, Owner: "slow", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, slowRelay.settle(ctx, time.Now(), settlement{done: []int64{replayed}, doneAttempts: []int32{slow}}))
	require.Zero(t, slowRelay.Stats().Published, "a late settle recorded a replayed row")
	require.Contains(t, logs.String(), `level=WARN msg="outbox relay: confirmed rows were claimed again since this relay's claim`)
	require.Contains(t, logs.String(), "rows=1 confirmed=1")
	pending, owner, sentBy := state(replayed)
	require.True(t, pending, "a late settle cancelled the replay")
	require.Nil(t, owner)
	require.Nil(t, sentBy)

	// Claimed again by the same relay: the older claim's settle records
	// nothing, the newer one's records the row.
	again := rowID(ids[1])
	first := claimAs("slow", again)
	second := claimAs("slow", again)
	require.Zero(t, settleRows(t, b.pool, "slow", again, first))
	pending, _, _ = state(again)
	require.True(t, pending)
	require.EqualValues(t, 1, settleRows(t, b.pool, "slow", again, second))
	pending, _, sentBy = state(again)
	require.False(t, pending)
	require.Equal(t, "slow", *sentBy)

	// Taken for dead: another relay cleared the lease (releaseGoneSQL)
	// before anyone claimed the row again. The confirmed publish is still
	// recorded, so the row is not published once more.
	released := rowID(ids[2])
	gone := claimAs("gone", released)
	_, err = b.pool.Exec(ctx, releaseGoneSQL, []string{"gone"})
	require.NoError(t, err)
	require.EqualValues(t, 1, settleRows(t, b.pool, "gone", released, gone))
	pending, _, sentBy = state(released)
	require.False(t, pending)
	require.Equal(t, "gone", *sentBy)

	// The replay is published by a running relay.
	deliveries, err := b.ch.Consume(testQueue, "", true, false, false, false, nil)
	require.NoError(t, err)
	startRelay(t, b, RelayConfig{})
	waitUnpublished(t, ctx, b.pool, 0)
	select {
	case d := <-deliveries:
		require.Equal(t, ids[0], d.MessageId, "only the replay is published")
	case <-ctx.Done():
		t.Fatal("the replay was not published")
	}
}
