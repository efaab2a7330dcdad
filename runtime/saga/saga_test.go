package saga_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

const (
	stReserve      = "RESERVE_INVENTORY"
	stPayment      = "AUTHORIZE_PAYMENT"
	stShipping     = "SCHEDULE_SHIPPING"
	stCompReserve  = "COMPENSATING_RESERVE_INVENTORY"
	stCompleted    = sagadef.StateCompleted
	stFailed       = sagadef.StateFailed
	stCancelled    = sagadef.StateCancelled
	stManualReview = sagadef.StateManualReview
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	def := placeOrder(t, "saga_x", defOptions{})
	bad := *def
	bad.Table = `saga"; DROP TABLE x; --`
	_, err := saga.New(saga.Config{Pool: nil, Definition: &bad, Hooks: nil})
	require.ErrorContains(t, err, "Pool is required")
	require.ErrorContains(t, err, "Hooks is required")
	require.ErrorContains(t, err, "not a plain SQL identifier")

	_, err = saga.New(saga.Config{Definition: def, NewID: func() string { return "order-17" }})
	require.ErrorContains(t, err, `NewID returned "order-17", not a UUID`)

	uncompiled := &sagadef.Definition{Name: "x", Table: "saga_x", DataMessage: "no.such.Message"}
	_, err = saga.New(saga.Config{Definition: uncompiled})
	require.ErrorContains(t, err, "call Definition.Compile first")
	require.ErrorContains(t, err, "NewData is required")
}

// TestUpperCaseNewID: ids from a NewID that returns upper-case UUIDs are
// used in canonical form, as PostgreSQL returns the saga's uuid columns, so
// a reply that answers a command as it was sent (its outbox message id)
// advances the saga instead of being taken for a late reply.
func TestUpperCaseNewID(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	b.engine = b.newEngine(t, func(c *saga.Config) { c.NewID = func() string { return strings.ToUpper(newID()) } })
	id := b.start(t, "order-up")
	require.Equal(t, strings.ToLower(id), id)
	out := b.outbox(t, id)
	require.Len(t, out, 1, "the first command is listed under the saga id the database holds")
	require.Equal(t, strings.ToLower(out[0].MessageID), out[0].MessageID)
	_, err := b.reply(t, id, msg(msgInventoryReserved, "order-up"), out[0].MessageID)
	require.NoError(t, err)
	require.Equal(t, stPayment, b.status(t, id).State)
	require.Equal(t, []string{"start:new:>" + stReserve, "InventoryReserved:new:" + stReserve + ">" + stPayment}, trail(b.history(t, id)))
}

func TestStartIdempotentOnBusinessKey(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()

	const n = 6
	type result struct {
		id      string
		created bool
		err     error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, created, err := b.engine.Start(ctx, msg(msgPlaceOrder, "order-1"), message.Meta{MessageID: newID()})
			results[i] = result{id, created, err}
		})
	}
	wg.Wait()
	created := 0
	for _, r := range results {
		require.NoError(t, r.err)
		require.Equal(t, results[0].id, r.id, "every start returns the one instance")
		if r.created {
			created++
		}
	}
	require.Equal(t, 1, created, "exactly one start creates the instance")

	var rows int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_place_order WHERE business_key = 'order-1'`).Scan(&rows))
	require.Equal(t, 1, rows)

	id := results[0].id
	require.Equal(t, []string{"ReserveInventory"}, outboxTypes(b.outbox(t, id)), "repeated starts send nothing")
	h := b.history(t, id)
	require.Len(t, h, n)
	require.Equal(t, sagadef.TriggerStart, h[0].Trigger)
	require.Equal(t, sagadef.ClassNew.String(), h[0].Class)
	for _, a := range h[1:] {
		require.Equal(t, sagadef.ClassDuplicate.String(), a.Class)
		require.Equal(t, int64(1), a.Version)
	}

	// A start in the caller's transaction rolls back with it.
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, created, err := b.engine.StartTx(ctx, tx, msg(msgPlaceOrder, "order-2"), message.Meta{})
		require.NoError(t, err)
		require.True(t, created)
		return errors.New("caller aborts")
	})
	require.Error(t, err)
	_, err = b.engine.StatusByBusinessKey(ctx, "order-2")
	require.ErrorIs(t, err, saga.ErrNotFound)

	// The wrong start message is refused.
	_, _, err = b.engine.Start(ctx, msg(msgReserveInventory, "order-3"), message.Meta{})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))
}

func TestHappyPath(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	startID := newID()
	id, created, err := b.engine.Start(context.Background(), msg(msgPlaceOrder, "order-1"),
		message.Meta{MessageID: startID, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	require.NoError(t, err)
	require.True(t, created)

	st := b.status(t, id)
	require.Equal(t, stReserve, st.State)
	require.Equal(t, int64(1), st.Version)
	require.Equal(t, "order-1", st.BusinessKey)
	require.Equal(t, baseTime.Add(stepTimeout), st.TimeoutAt)
	require.Equal(t, baseTime.Add(sagaDeadline), st.DeadlineAt)

	st = b.mustReply(t, id, msgInventoryReserved)
	require.Equal(t, stPayment, st.State)
	st = b.mustReply(t, id, msgPaymentAuthorized)
	require.Equal(t, stShipping, st.State)
	st = b.mustReply(t, id, msgShippingScheduled)
	require.Equal(t, stCompleted, st.State)
	require.True(t, st.Terminal())
	require.Equal(t, int64(4), st.Version)
	require.True(t, st.TimeoutAt.IsZero(), "a completed saga has no timeout armed")
	require.Equal(t, []string{"InventoryReserved", "PaymentAuthorized", "ShippingScheduled"}, applied(t, st))

	out := b.outbox(t, id)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping"}, outboxTypes(out))
	require.Equal(t, startID, out[0].CausationID, "the first command is caused by the start message")
	for _, r := range out {
		require.Equal(t, id, r.SagaID)
		require.Equal(t, id, r.CorrelationID)
		require.Equal(t, sagaTypeName, r.SagaType)
		require.Equal(t, r.MessageType+"/order-1", r.IdempotencyKey)
	}

	h := b.history(t, id)
	require.Equal(t, []string{
		"start:new:>" + stReserve,
		"InventoryReserved:new:" + stReserve + ">" + stPayment,
		"PaymentAuthorized:new:" + stPayment + ">" + stShipping,
		"ShippingScheduled:new:" + stShipping + ">" + stCompleted,
	}, trail(h))
	for i, a := range h {
		require.Equal(t, int64(i+1), a.Version)
		if i > 0 {
			// Each reply is caused by the command it answers, and the
			// next command is caused by the reply.
			require.Equal(t, out[i-1].MessageID, a.CausationID)
			require.NotEmpty(t, a.MessageID)
			if i < len(out) {
				require.Equal(t, a.MessageID, out[i].CausationID)
			}
		}
	}
}

func TestPaymentDeclinedReleasesInventory(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	b.mustReply(t, id, msgInventoryReserved)
	st := b.mustReply(t, id, msgPaymentDeclined)
	require.Equal(t, stCompReserve, st.State)
	st = b.mustReply(t, id, msgInventoryReleased)
	require.Equal(t, stFailed, st.State)

	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)))
	require.Equal(t, []string{
		"start:new:>" + stReserve,
		"InventoryReserved:new:" + stReserve + ">" + stPayment,
		"PaymentDeclined:new:" + stPayment + ">" + stCompReserve,
		"InventoryReleased:new:" + stCompReserve + ">" + stFailed,
	}, trail(b.history(t, id)))
}

func TestDuplicateReplyHasNoEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	cmd := b.status(t, id).PendingMessageID
	_, err := b.reply(t, id, msg(msgInventoryReserved, "order-1"), cmd)
	require.NoError(t, err)
	before := b.status(t, id)

	// The participant answered twice (a new message id each time).
	dupID, err := b.reply(t, id, msg(msgInventoryReserved, "order-1"), cmd)
	require.NoError(t, err)

	after := b.status(t, id)
	require.Equal(t, before.Version, after.Version)
	require.Equal(t, before.State, after.State)
	require.Equal(t, []string{"InventoryReserved"}, applied(t, after))
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
	h := b.history(t, id)
	last := h[len(h)-1]
	require.Equal(t, sagadef.ClassDuplicate.String(), last.Class)
	require.Equal(t, dupID, last.MessageID)
	require.Equal(t, cmd, last.CausationID)
	require.Equal(t, stPayment, last.From)
	require.Equal(t, stPayment, last.To)
}

func TestConflictingReplyGoesToManualReview(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	cmd := b.status(t, id).PendingMessageID
	b.mustReply(t, id, msgInventoryReserved)

	// The same command is now said to have failed.
	_, err := b.reply(t, id, msg(msgInventoryFailed, "order-1"), cmd)
	require.NoError(t, err)
	st := b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	require.NotEmpty(t, st.ReviewReason)
	last := b.history(t, id)[len(b.history(t, id))-1]
	require.Equal(t, sagadef.ClassConflicting.String(), last.Class)
	require.Equal(t, stManualReview, last.To)

	// Nothing waits on a clock in manual review.
	b.clock.Advance(2 * sagaDeadline)
	n, err := b.engine.FireTimeouts(context.Background(), 10)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestSagaIDInAnyUUIDForm: a reply whose saga id header holds the saga's
// UUID in another form uuid.Parse accepts (urn:uuid:, upper case) reaches
// its saga, alone as in a batch.
func TestSagaIDInAnyUUIDForm(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	st := b.status(t, id)
	_, err := b.reply(t, "urn:uuid:"+strings.ToUpper(id), msg(msgInventoryReserved, "order-1"), st.PendingMessageID)
	require.NoError(t, err)
	require.Equal(t, stPayment, b.status(t, id).State)
}

func TestHandleRefusesMessagesItCannotPlace(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	id := b.start(t, "order-1")

	handle := func(d *consumer.Delivery) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) })
	}
	deliver := func(m testMsg, meta message.Meta) error {
		env, err := message.New(m, meta)
		require.NoError(t, err)
		return handle(&consumer.Delivery{Envelope: env, Message: m})
	}

	err := deliver(msg(msgInventoryReserved, "order-1"), message.Meta{SagaID: newID(), SagaType: sagaTypeName})
	require.ErrorIs(t, err, saga.ErrNotFound)
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))

	err = deliver(msg(msgInventoryReserved, "order-1"), message.Meta{SagaID: "not-a-uuid"})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))

	err = deliver(msg(msgInventoryReserved, "order-1"), message.Meta{SagaID: id, SagaType: "other.Saga"})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))

	err = deliver(msg(msgInventoryReserved, ""), message.Meta{})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err), "no saga id and no correlation key")

	err = deliver(msg(msgInventoryReserved, "no-such-order"), message.Meta{})
	require.ErrorIs(t, err, saga.ErrNotFound)

	err = handle(&consumer.Delivery{})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))

	unregistered := newInfo("Unregistered", 0)
	err = deliver(msg(unregistered, "order-1"), message.Meta{SagaID: id})
	require.ErrorContains(t, err, "unknown message type")
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))

	require.Equal(t, int64(1), b.status(t, id).Version, "nothing was applied")

	// An event without a saga id finds its saga by correlation key.
	st := b.status(t, id)
	require.NoError(t, deliver(msg(msgInventoryReserved, "order-1"), message.Meta{CausationID: st.PendingMessageID}))
	require.Equal(t, stPayment, b.status(t, id).State)

	// A message the saga never expects is audited as invalid and acked.
	require.NoError(t, deliver(msg(msgUnrelatedEvent, "order-1"), message.Meta{SagaID: id}))
	h := b.history(t, id)
	require.Equal(t, sagadef.ClassInvalid.String(), h[len(h)-1].Class)
	require.Equal(t, stPayment, b.status(t, id).State)
}

// TestConcurrentRepliesSerialize delivers many copies of one reply (each with
// its own message id, as a participant that answered several times would)
// at once. Without the row lock several would see the old state and apply;
// without the version guard a lost update would go unnoticed.
func TestConcurrentRepliesSerialize(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	cmd := b.status(t, id).PendingMessageID

	const n = 12
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = b.reply(t, id, msg(msgInventoryReserved, "order-1"), cmd)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	st := b.status(t, id)
	require.Equal(t, stPayment, st.State)
	require.Equal(t, int64(2), st.Version)
	require.Equal(t, []string{"InventoryReserved"}, applied(t, st))
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))

	classes := map[string]int{}
	for _, a := range b.history(t, id)[1:] {
		classes[a.Class]++
	}
	require.Equal(t, map[string]int{sagadef.ClassNew.String(): 1, sagadef.ClassDuplicate.String(): n - 1}, classes)

	// Then a run of different replies, each racing duplicates of itself:
	// the saga still walks the steps exactly once each.
	for _, step := range []struct {
		reply string
		state string
	}{{msgPaymentAuthorized.FullName, stShipping}, {msgShippingScheduled.FullName, stCompleted}} {
		in, _ := testRegistry.Lookup(step.reply)
		cmd := b.status(t, id).PendingMessageID
		for i := range n {
			wg.Go(func() { _, errs[i] = b.reply(t, id, msg(in, "order-1"), cmd) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, step.state, b.status(t, id).State)
	}
	st = b.status(t, id)
	require.Equal(t, int64(4), st.Version)
	require.Equal(t, []string{"InventoryReserved", "PaymentAuthorized", "ShippingScheduled"}, applied(t, st))
	require.Len(t, b.history(t, id), 1+3*n)
}

// TestVersionGuardRefusesStaleWrite bypasses the row lock: a transition
// computed from a row read before another transition committed must fail
// rather than overwrite the newer version.
func TestVersionGuardRefusesStaleWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	id := b.start(t, "order-1")
	cmd := b.status(t, id).PendingMessageID
	stale, err := b.engine.SnapshotForTest(ctx, id)
	require.NoError(t, err)

	b.mustReply(t, id, msgInventoryReserved)

	m := msg(msgInventoryReserved, "order-1")
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return b.engine.TransitionForTest(ctx, tx, stale, sagadef.Trigger{
			Kind: m.SagaMessageInfo().FullName, Message: m, MessageID: newID(), CausationID: cmd,
		})
	})
	require.ErrorIs(t, err, saga.ErrVersionConflict)
	require.Equal(t, retry.ClassTransient, retry.ClassOf(err), "a retry reloads and classifies again")
	st := b.status(t, id)
	require.Equal(t, int64(2), st.Version)
	require.Equal(t, []string{"InventoryReserved"}, applied(t, st))
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
}

// TestHandleStartsFromDeliveredStartMessage: the saga's queue may carry its
// start command; a redelivered or resent start finds the instance by its
// business key and starts nothing.
func TestHandleStartsFromDeliveredStartMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	deliver := func() string {
		m := msg(msgPlaceOrder, "order-1")
		env, err := message.New(m, message.Meta{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return b.engine.Handle(ctx, tx, &consumer.Delivery{Envelope: env, Message: m})
		}))
		return env.MessageID
	}
	first := deliver()
	second := deliver()

	st, err := b.engine.StatusByBusinessKey(ctx, "order-1")
	require.NoError(t, err)
	require.Equal(t, stReserve, st.State)
	out := b.outbox(t, st.ID)
	require.Len(t, out, 1)
	require.Equal(t, first, out[0].CausationID)
	h := b.history(t, st.ID)
	require.Equal(t, []string{"start:new:>" + stReserve, "start:duplicate:" + stReserve + ">" + stReserve}, trail(h))
	require.Equal(t, first, h[0].MessageID)
	require.Equal(t, second, h[1].MessageID)
}

// TestRepliesForOneSagaInOneScope handles two replies to the same command in
// one transaction with one write scope: the engine must send its own queued
// update before it locks the row again, so the second reply is a duplicate
// rather than a second transition (or a version conflict when the writes are
// sent).
func TestRepliesForOneSagaInOneScope(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	id := b.start(t, "o-scope")
	st := b.status(t, id)
	deliver := func(ctx context.Context, tx pgx.Tx) {
		m := msg(msgInventoryReserved, st.BusinessKey)
		env, err := message.New(m, message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: st.PendingMessageID})
		require.NoError(t, err)
		require.NoError(t, b.engine.Handle(ctx, tx, &consumer.Delivery{Envelope: env, Message: m, Queue: "test.replies", Attempt: 1}))
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		stx, scope := txq.WithScope(tx)
		deliver(ctx, stx)
		require.Positive(t, scope.Len(), "the transition's writes wait for the flush")
		deliver(ctx, stx)
		return scope.Flush(ctx)
	}))
	var classes []string
	for _, r := range b.history(t, id) {
		if strings.HasSuffix(r.Trigger, "InventoryReserved") {
			classes = append(classes, r.Class)
		}
	}
	require.Equal(t, []string{"new", "duplicate"}, classes)
	require.Equal(t, int64(2), b.status(t, id).Version)
}

// TestOperateInAWriteScopeReturnsTheNewState: called from a consumer's
// handler, an operator action's writes are queued; the status it returns
// must still be the instance after the action.
func TestOperateInAWriteScopeReturnsTheNewState(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	id := b.start(t, "o-operate")
	before := b.status(t, id)
	var got saga.Status
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		stx, scope := txq.WithScope(tx)
		var err error
		got, err = b.engine.OperateTx(ctx, stx, saga.Operation{Trigger: sagadef.TriggerOperatorCancel, SagaID: id,
			ExpectedVersion: before.Version, Operator: "olga", Reason: "customer called"})
		if err != nil {
			return err
		}
		return scope.Flush(ctx)
	}))
	require.Equal(t, before.Version+1, got.Version)
	require.Equal(t, b.status(t, id).State, got.State)
	require.NotEqual(t, before.State, got.State)
}
