package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// toManualReview drives a new saga into MANUAL_REVIEW with a conflicting
// reply.
func (b *testBundle) toManualReview(t *testing.T, order string) saga.Status {
	t.Helper()
	id := b.start(t, order)
	cmd := b.status(t, id).PendingMessageID
	b.mustReply(t, id, msgInventoryReserved)
	_, err := b.reply(t, id, msg(msgInventoryFailed, order), cmd)
	require.NoError(t, err)
	st := b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	return st
}

func TestOperatorResolveIsVersionGuardedAndAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	st := b.toManualReview(t, "order-1")
	auditRows := len(b.history(t, st.ID))

	_, err := b.engine.Resolve(ctx, st.ID, st.Version-1, stCompleted, "alice", "shipped by hand")
	var vc *saga.VersionConflictError
	require.ErrorAs(t, err, &vc)
	require.ErrorIs(t, err, saga.ErrVersionConflict)
	require.Equal(t, st.Version, vc.Actual)
	require.Equal(t, st.Version-1, vc.Expected)
	require.Equal(t, stManualReview, b.status(t, st.ID).State)
	require.Len(t, b.history(t, st.ID), auditRows, "a refused action changes nothing")

	// Who and why are required.
	_, err = b.engine.Resolve(ctx, st.ID, st.Version, stCompleted, "", "shipped by hand")
	require.ErrorContains(t, err, "Operator is required")
	_, err = b.engine.Resolve(ctx, st.ID, st.Version, stCompleted, "alice", " ")
	require.ErrorContains(t, err, "Reason is required")
	_, err = b.engine.Resolve(ctx, st.ID, st.Version, "NO_SUCH_STATE", "alice", "x")
	require.ErrorContains(t, err, "unknown state")

	got, err := b.engine.Resolve(ctx, st.ID, st.Version, stCompleted, "alice", "shipped by hand")
	require.NoError(t, err)
	require.Equal(t, stCompleted, got.State)
	require.Equal(t, st.Version+1, got.Version)
	reloaded := b.status(t, st.ID)
	require.Equal(t, got.State, reloaded.State)
	require.Equal(t, got.Version, reloaded.Version)

	h := b.history(t, st.ID)
	require.Len(t, h, auditRows+1)
	last := h[len(h)-1]
	require.Equal(t, sagadef.TriggerOperatorResolve, last.Trigger)
	require.Equal(t, "alice", last.Operator)
	require.Contains(t, last.Note, "shipped by hand")
	require.Equal(t, stManualReview, last.From)
	require.Equal(t, stCompleted, last.To)
	require.Equal(t, got.Version, last.Version)

	// Repeating the resolution (a double click, with the old version) is a
	// no-op, not a conflict.
	again, err := b.engine.Resolve(ctx, st.ID, st.Version, stCompleted, "alice", "shipped by hand")
	require.NoError(t, err)
	require.Equal(t, got.Version, again.Version)
	require.Len(t, b.history(t, st.ID), auditRows+1)

	// A terminal saga cannot be cancelled.
	_, err = b.engine.Cancel(ctx, st.ID, got.Version, "alice", "too late")
	require.ErrorIs(t, err, saga.ErrRejected)

	_, err = b.engine.Cancel(ctx, newID(), 1, "alice", "no such saga")
	require.ErrorIs(t, err, saga.ErrNotFound)
}

func TestOperatorCancelIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	st := b.toManualReview(t, "order-1")

	got, err := b.engine.Cancel(ctx, st.ID, st.Version, "bob", "customer withdrew")
	require.NoError(t, err)
	require.Equal(t, stCancelled, got.State)
	again, err := b.engine.Cancel(ctx, st.ID, st.Version, "bob", "customer withdrew")
	require.NoError(t, err)
	require.Equal(t, got.Version, again.Version)
	n := 0
	for _, a := range b.history(t, st.ID) {
		if a.Trigger == sagadef.TriggerOperatorCancel {
			n++
			require.Equal(t, "bob", a.Operator)
		}
	}
	require.Equal(t, 1, n)
}

func TestOperatorCompensate(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	st := b.toManualReview(t, "order-1")
	before := len(b.outbox(t, st.ID))

	got, err := b.engine.Compensate(ctx, st.ID, st.Version, "carol", "inventory was reserved after all")
	require.NoError(t, err)
	require.Equal(t, stCompReserve, got.State)
	out := b.outbox(t, st.ID)
	require.Len(t, out, before+1)
	require.Equal(t, msgReleaseInventory.FullName, out[len(out)-1].MessageType)
	require.Empty(t, out[len(out)-1].CausationID, "an operator action has no causing message")

	got = b.mustReply(t, st.ID, msgInventoryReleased)
	require.True(t, got.Terminal(), "state %s", got.State)

	// A second compensate with the version it was decided on is refused.
	_, err = b.engine.Compensate(ctx, st.ID, st.Version, "carol", "again")
	require.True(t, errors.Is(err, saga.ErrVersionConflict) || errors.Is(err, saga.ErrRejected), "got %v", err)
}

// TestOperatorRacesLiveReply cancels sagas at the version the operator saw
// while the reply they wait for arrives. Exactly one of the two wins: either
// the reply moved the saga on and the cancel fails with a version conflict,
// or the cancel won and the reply is audited without effect.
func TestOperatorRacesLiveReply(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()

	// Deterministic orders first.
	id := b.start(t, "order-a")
	seen := b.status(t, id)
	b.mustReply(t, id, msgInventoryReserved)
	_, err := b.engine.Cancel(ctx, id, seen.Version, "dave", "stale screen")
	require.ErrorIs(t, err, saga.ErrVersionConflict)
	require.Equal(t, stPayment, b.status(t, id).State)

	id = b.start(t, "order-b")
	seen = b.status(t, id)
	_, err = b.engine.Cancel(ctx, id, seen.Version, "dave", "customer called")
	require.NoError(t, err)
	_, err = b.reply(t, id, msg(msgInventoryReserved, "order-b"), seen.PendingMessageID)
	require.NoError(t, err, "a reply to a cancelled saga is acked")
	st := b.status(t, id)
	require.Equal(t, stCancelled, st.State)
	h := b.history(t, id)
	require.NotEqual(t, sagadef.ClassNew.String(), h[len(h)-1].Class)
	require.Equal(t, st.Version, h[len(h)-1].Version)

	// Then real races.
	const sagas = 8
	var wg sync.WaitGroup
	for i := range sagas {
		order := fmt.Sprintf("order-%d", i)
		id := b.start(t, order)
		seen := b.status(t, id)
		var cancelErr, replyErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, cancelErr = b.engine.Cancel(ctx, id, seen.Version, "dave", "race")
		}()
		go func() {
			defer wg.Done()
			_, replyErr = b.reply(t, id, msg(msgInventoryReserved, order), seen.PendingMessageID)
		}()
		wg.Wait()
		require.NoError(t, replyErr)
		st := b.status(t, id)
		if cancelErr != nil {
			require.ErrorIs(t, cancelErr, saga.ErrVersionConflict)
			require.Equal(t, stPayment, st.State)
		} else {
			require.Equal(t, stCancelled, st.State)
			require.Empty(t, applied(t, st), "the reply did not apply to the cancelled saga")
		}
		require.Equal(t, int64(2), st.Version, "exactly one of the two changed the saga")
	}
}

// TestOperatorRetryAfterARecordedFailure: a retry of a step whose business
// failure was recorded sends its command with message.HeaderOperatorRetry
// (1, then 2), so that an idempotent participant runs it again instead of
// replaying the failure; the first command carries no such header.
func TestOperatorRetryAfterARecordedFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{shippingFails: true})
	id := b.toShipping(t, "order-1")
	retries := func() []any {
		t.Helper()
		rows, err := b.pool.Query(context.Background(), `SELECT headers->'`+message.HeaderOperatorRetry+`'
FROM saga_outbox WHERE saga_id = $1 AND message_type = $2 ORDER BY id`, id, msgScheduleShipping.FullName)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[any])
		require.NoError(t, err)
		return out
	}
	for n := 1; n <= 2; n++ {
		require.Equal(t, stManualReview, b.mustReply(t, id, msgShippingFailed).State)
		st, err := b.engine.Retry(context.Background(), id, b.status(t, id).Version, "alice", "carrier fixed")
		require.NoError(t, err)
		require.Equal(t, stShipping, st.State)
	}
	require.Equal(t, []any{nil, float64(1), float64(2)}, retries())
}

// TestUnreadableData: an instance whose stored data cannot be decoded is
// still shown (Status.DataError), a message for it is parked at once
// (permanent), an operator's retry is refused with the reason, a due
// timeout ends in manual review after MaxDeferrals, and cancel applies,
// all keeping the stored bytes as they are.
func TestUnreadableData(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	b.engine = b.newEngine(t, func(c *saga.Config) { c.MaxDeferrals = 2 })
	ctx := context.Background()
	id := b.start(t, "order-1")
	garbage := []byte{0xff, 0xff, 0xff}
	_, err := b.pool.Exec(ctx, `UPDATE saga_place_order SET data = $2 WHERE id = $1`, id, garbage)
	require.NoError(t, err)
	stored := func() []byte {
		var data []byte
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT data FROM saga_place_order WHERE id = $1`, id).Scan(&data))
		return data
	}

	st := b.status(t, id)
	require.Nil(t, st.Data)
	require.Contains(t, st.DataError, "saga data cannot be decoded")
	require.Equal(t, stReserve, st.State)

	_, err = b.reply(t, id, msg(msgInventoryReserved, "order-1"), st.PendingMessageID)
	require.ErrorIs(t, err, saga.ErrUnreadableData)
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err), "parked at once: no retry can decode it")

	_, err = b.engine.Retry(ctx, id, st.Version, "alice", "try again")
	require.ErrorIs(t, err, saga.ErrRejected)
	require.ErrorContains(t, err, "only cancel and resolve apply")

	b.clock.Advance(stepTimeout)
	require.Zero(t, b.fire(t))
	b.clock.Advance(time.Minute)
	require.Zero(t, b.fire(t))
	b.clock.Advance(time.Minute)
	require.Equal(t, 1, b.fire(t), "after MaxDeferrals, the stuck trigger needs no data")
	st = b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	require.Contains(t, st.ReviewReason, "saga data cannot be decoded")
	require.Equal(t, garbage, stored())

	st, err = b.engine.Cancel(ctx, id, st.Version, "alice", "data lost; refunded by hand")
	require.NoError(t, err)
	require.Equal(t, stCancelled, st.State)
	require.Equal(t, garbage, stored(), "the stored bytes are kept for whoever repairs them")
}
