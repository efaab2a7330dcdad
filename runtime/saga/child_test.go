package saga_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// The parent saga of the child tests: only its identity travels in the
// envelopes of the messages its child step sends.
const parentType = "test.trip.v1.Trip"

// parentEnvelope is what a parent's child step sends: the child's start or
// cancel message with the parent's saga id, type and correlation id.
func parentEnvelope(t *testing.T, m message.Message, parentID string) message.Envelope {
	t.Helper()
	env, err := message.New(m, message.Meta{SagaID: parentID, SagaType: parentType, CorrelationID: "trip-7", CausationID: newID()})
	require.NoError(t, err)
	return env
}

// deliver hands env to the child's engine in a transaction of its own, as
// its consumer would.
func (b *testBundle) deliver(t *testing.T, env message.Envelope, m message.Message) error {
	t.Helper()
	d := &consumer.Delivery{Envelope: env, Message: m, Queue: "test.saga.place-order", Attempt: 1, ReceivedAt: time.Now()}
	return pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.engine.Handle(context.Background(), tx, d)
	})
}

// childID returns the id of the child instance of business key order.
func (b *testBundle) childID(t *testing.T, order string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT id::text FROM saga_place_order WHERE business_key = $1`, order).Scan(&id))
	return id
}

// TestChildAnswersItsParent: a parent's start message starts the child
// and records the parent; a duplicate start delivery starts nothing; the
// transition that completes the child writes, in its own transaction, the
// completed reply addressed to the parent as the answer to its start
// command; a start the parent resends after that is answered again.
func TestChildAnswersItsParent(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{child: true})
	parentID := newID()
	start := msg(msgPlaceOrder, "pay-1")
	startEnv := parentEnvelope(t, start, parentID)
	require.NoError(t, b.deliver(t, startEnv, start))
	id := b.childID(t, "pay-1")
	st := b.status(t, id)
	require.Equal(t, stReserve, st.State)
	require.Equal(t, &sagadef.Parent{SagaType: parentType, SagaID: parentID, CorrelationID: "trip-7", StartMessageID: startEnv.MessageID},
		st.Progress.Parent)

	// The same start delivered again (a new message id: the parent's
	// relay published it twice) finds the instance by business key.
	again := parentEnvelope(t, start, parentID)
	require.NoError(t, b.deliver(t, again, start))
	require.Equal(t, id, b.childID(t, "pay-1"))
	require.Equal(t, []string{"ReserveInventory"}, outboxTypes(b.outbox(t, id)), "a duplicate start sends nothing")
	require.Empty(t, b.outbox(t, parentID), "the child has not ended: nothing to answer yet")

	st = b.mustReply(t, id, msgInventoryReserved)
	require.Equal(t, sagadef.StateCompleted, st.State)
	replies := b.outbox(t, parentID)
	require.Len(t, replies, 1)
	r := replies[0]
	require.Equal(t, msgChildCompleted.FullName, r.MessageType)
	require.Equal(t, parentType, r.SagaType)
	require.Equal(t, "trip-7", r.CorrelationID)
	require.Equal(t, startEnv.MessageID, r.CausationID, "the reply answers the parent's start command")

	// The parent resends its start (its step retried on timeout): the
	// ended child answers the resent command too.
	resent := parentEnvelope(t, start, parentID)
	require.NoError(t, b.deliver(t, resent, start))
	replies = b.outbox(t, parentID)
	require.Len(t, replies, 2)
	require.Equal(t, msgChildCompleted.FullName, replies[1].MessageType)
	require.Equal(t, resent.MessageID, replies[1].CausationID)
}

// TestChildFailureAnswersParent: a child that fails answers with its
// failed reply; one a business cancel (not its parent) stops answers as
// failed too, since it did not do what the parent asked.
func TestChildFailureAnswersParent(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{child: true})
	for _, order := range []string{"pay-failed", "pay-cancelled"} {
		parentID := newID()
		start := msg(msgPlaceOrder, order)
		startEnv := parentEnvelope(t, start, parentID)
		require.NoError(t, b.deliver(t, startEnv, start))
		id := b.childID(t, order)
		if order == "pay-failed" {
			require.Equal(t, sagadef.StateFailed, b.mustReply(t, id, msgInventoryFailed).State)
		} else {
			c := cancelOrder(order, "support", "customer called")
			env, err := message.New(c, message.Meta{})
			require.NoError(t, err)
			require.NoError(t, b.deliver(t, env, c))
			require.Equal(t, sagadef.StateCancelled, b.mustReply(t, id, msgInventoryReleased).State)
		}
		replies := b.outbox(t, parentID)
		require.Len(t, replies, 1, order)
		require.Equal(t, msgChildFailed.FullName, replies[0].MessageType, order)
		require.Equal(t, startEnv.MessageID, replies[0].CausationID, order)
	}
}

// TestParentCompensatesCompletedChild: the parent's compensation, the
// child's cancel message sent from the parent, finds the child COMPLETED:
// the child compensates its steps in reverse and answers the cancel with
// its cancelled reply once CANCELLED. A second cancel (the parent resends
// its compensation) changes nothing and is answered again.
func TestParentCompensatesCompletedChild(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{child: true})
	parentID := newID()
	start := msg(msgPlaceOrder, "pay-2")
	require.NoError(t, b.deliver(t, parentEnvelope(t, start, parentID), start))
	id := b.childID(t, "pay-2")
	require.Equal(t, sagadef.StateCompleted, b.mustReply(t, id, msgInventoryReserved).State)

	c := cancelOrder("pay-2", "trip", "trip compensates")
	cancelEnv := parentEnvelope(t, c, parentID)
	require.NoError(t, b.deliver(t, cancelEnv, c))
	st := b.status(t, id)
	require.Equal(t, stCompReserve, st.State)
	require.Equal(t, cancelEnv.MessageID, st.Progress.Parent.CancelMessageID)
	require.Equal(t, []string{"ReserveInventory", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)))
	require.Len(t, b.outbox(t, parentID), 1, "only the completed reply so far")

	require.Equal(t, sagadef.StateCancelled, b.mustReply(t, id, msgInventoryReleased).State)
	replies := b.outbox(t, parentID)
	require.Len(t, replies, 2)
	require.Equal(t, msgChildCancelled.FullName, replies[1].MessageType)
	require.Equal(t, cancelEnv.MessageID, replies[1].CausationID, "the cancelled reply answers the parent's cancel")

	second := parentEnvelope(t, c, parentID)
	require.NoError(t, b.deliver(t, second, c))
	require.Equal(t, sagadef.StateCancelled, b.status(t, id).State)
	require.Equal(t, []string{"ReserveInventory", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)), "nothing compensated twice")
	replies = b.outbox(t, parentID)
	require.Len(t, replies, 3)
	require.Equal(t, msgChildCancelled.FullName, replies[2].MessageType)
	require.Equal(t, second.MessageID, replies[2].CausationID)
	h := b.history(t, id)
	require.Contains(t, h[len(h)-1].Note, "the saga already ended CANCELLED")
}

// TestChildOutcomeSurvivesRelayCrash: the child's terminal transition
// commits its outcome reply with it; no relay runs (the process died after
// the commit, before publishing). A relay started afterwards publishes the
// reply to RabbitMQ with the parent's identity, where the parent's queue
// receives it.
func TestChildOutcomeSurvivesRelayCrash(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{child: true})
	parentID := newID()
	start := msg(msgPlaceOrder, "pay-3")
	startEnv := parentEnvelope(t, start, parentID)
	require.NoError(t, b.deliver(t, startEnv, start))
	id := b.childID(t, "pay-3")
	require.Equal(t, sagadef.StateCompleted, b.mustReply(t, id, msgInventoryReserved).State)
	var unpublished int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_outbox WHERE saga_id = $1`, parentID).Scan(&unpublished))
	require.Equal(t, 1, unpublished, "the reply is committed with the terminal state, waiting for a relay")

	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	quiet := slog.New(slog.DiscardHandler)
	conn, err := broker.Dial(ctx, testenv.AMQP(t), broker.ConnConfig{Name: "child-relay", MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	const parentQueue = "trip.saga.trip"
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: msgChildCompleted.Exchange, Kind: "direct"}, {Name: msgReserveInventory.Exchange, Kind: "direct"}},
		Queues:    []broker.Queue{{Name: parentQueue}},
		Bindings:  []broker.Binding{{Queue: parentQueue, Exchange: msgChildCompleted.Exchange, RoutingKey: msgChildCompleted.RoutingKey}},
	}))
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: conn, PollInterval: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()

	var got message.Envelope
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(parentQueue, true)
		if err != nil || !ok {
			return false
		}
		got, err = message.FromDelivery(&d)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, msgChildCompleted.FullName, got.MessageType)
	require.Equal(t, parentID, got.SagaID)
	require.Equal(t, parentType, got.SagaType)
	require.Equal(t, startEnv.MessageID, got.CausationID)
	stop()
	<-done
}

// TestChildInReviewTellsParent: a child whose step times out into manual
// review sends its parent the manual-review reply, in the transaction of
// that transition, naming the child and the reason; an operator's resolve
// of the child then sends the outcome the parent waits for.
func TestChildInReviewTellsParent(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{child: true, reserveTimeout: sagadef.TimeoutManualReview})
	parentID := newID()
	start := msg(msgPlaceOrder, "pay-4")
	startEnv := parentEnvelope(t, start, parentID)
	require.NoError(t, b.deliver(t, startEnv, start))
	id := b.childID(t, "pay-4")
	b.clock.Advance(stepTimeout + time.Second)
	n, err := b.engine.FireTimeouts(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st := b.status(t, id)
	require.Equal(t, sagadef.StateManualReview, st.State)

	var typ, causation, note string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT message_type, causation_id, headers->>$2
	FROM saga_outbox WHERE saga_id = $1`, parentID, message.HeaderChildReview).Scan(&typ, &causation, &note))
	require.Equal(t, msgChildInReview.FullName, typ)
	require.Equal(t, startEnv.MessageID, causation)
	require.Equal(t, sagaTypeName+" "+id+" (business key pay-4): "+st.ReviewReason, note)

	_, err = b.engine.Resolve(context.Background(), id, st.Version, sagadef.StateCompleted, "ops", "reserved by phone")
	require.NoError(t, err)
	replies := b.outbox(t, parentID)
	require.Len(t, replies, 2)
	require.Equal(t, msgChildCompleted.FullName, replies[1].MessageType)
	require.Equal(t, startEnv.MessageID, replies[1].CausationID)
}

// TestParentRecordsChildInReview: the parent's engine takes the child's
// account from HeaderChildReview, records it on the waiting step (status
// progress, audit note) and keeps waiting, stuck by saga.StuckRule with
// the child named in the reason; the child's outcome then moves the step
// on and clears the record.
func TestParentRecordsChildInReview(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{parent: true})
	id := b.start(t, "trip-1")
	st := b.status(t, id)
	const why = "test.pay.v1.Payment 9 (business key pay-9): step timed out"
	_, err := b.replyWith(t, id, msg(msgChildInReview, "trip-1"), st.PendingMessageID, map[string]any{message.HeaderChildReview: why})
	require.NoError(t, err)
	st = b.status(t, id)
	require.Equal(t, stReserve, st.State, "the step keeps waiting")
	require.Equal(t, &sagadef.ChildReview{Step: "ReserveInventory", Reason: why}, st.Progress.ChildReview)
	h := b.history(t, id)
	require.Contains(t, h[len(h)-1].Note, "child Payment of step ReserveInventory in manual review: "+why)
	rule := saga.NewStuckRule(b.def, time.Hour)
	stuck, err := b.engine.List(context.Background(), saga.ListFilter{Stuck: &rule})
	require.NoError(t, err)
	require.Equal(t, []string{id}, idsOf(stuck.Items), "stuck at once, long before any timeout")
	require.Equal(t, "step ReserveInventory waits on a child in manual review: "+why,
		rule.Reason(st.State, st.Progress.ChildReview, &st.TimeoutAt, nil, st.UpdatedAt, time.Now()))
	states, limits, grace := rule.Args()
	var stuckInState int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT stuck FROM (`+saga.SagaGaugeSQLForTest(b.def.Table, []string{stReserve})+`) AS g(state, n, stuck)`,
		states, limits, grace).Scan(&stuckInState))
	require.Equal(t, int64(1), stuckInState, "the saga.instances.stuck gauge counts it")

	st = b.mustReply(t, id, msgInventoryReserved)
	require.Equal(t, stPayment, st.State)
	require.Nil(t, st.Progress.ChildReview)
	stuck, err = b.engine.List(context.Background(), saga.ListFilter{Stuck: &rule})
	require.NoError(t, err)
	require.Empty(t, stuck.Items, "the step moved on")
}
