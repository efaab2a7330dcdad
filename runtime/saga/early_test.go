package saga_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestEarlyEventIsRecordedForItsStep delivers the event an external step
// waits for (a human approval, say) before the saga has reached that step:
// it was published after the saga started, but the reply that moves the
// saga to the step is still on its way (queued behind it, or published in
// the same transaction as the event). Messages published in order are not
// handled in order; the event must not be lost, nor wait in retry tiers.
// Directly, the event is recorded early on the instance and acknowledged.
// Through a real consumer and queue, the event comes first and the reply
// second: each is handled once (nothing goes through a retry tier), the
// reply leads the saga to the step, which the recorded event settles at
// once, and nothing is parked.
func TestEarlyEventIsRecordedForItsStep(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{externalPayment: true})
	id := b.start(t, "o-early")
	st := b.status(t, id)
	require.Equal(t, stReserve, st.State)

	// Directly: recorded early, the state unchanged.
	_, err := b.reply(t, "", msg(msgPaymentApproved, "o-early"), "")
	require.NoError(t, err)
	h := b.history(t, id)
	require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "PaymentApproved:early:RESERVE_INVENTORY>RESERVE_INVENTORY"}, trail(h))
	require.Contains(t, h[1].Note, "recorded early")
	require.Equal(t, st.Version+1, b.status(t, id).Version, "recorded on the instance")

	// Through the broker, another saga: the event first, the reply that
	// reaches the step second, one at a time.
	id = b.start(t, "o-early-queued")
	st = b.status(t, id)
	var mu sync.Mutex
	var handled []string
	send := runQueue(t, b, "test.saga.early", func(hctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		mu.Lock()
		handled = append(handled, d.Envelope.MessageType)
		mu.Unlock()
		return b.engine.Handle(hctx, tx, d)
	})
	event, err := message.New(msg(msgPaymentApproved, "o-early-queued"), message.Meta{})
	require.NoError(t, err)
	reply, err := message.New(msg(msgInventoryReserved, "o-early-queued"), message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: st.PendingMessageID})
	require.NoError(t, err)
	send(event)
	send(reply)

	require.Eventually(t, func() bool {
		return b.status(t, id).State == stShipping
	}, 30*time.Second, 20*time.Millisecond, "the recorded event settles the step once the saga enters it")
	mu.Lock()
	require.Equal(t, []string{msgPaymentApproved.FullName, msgInventoryReserved.FullName}, handled,
		"each message handled once, the event first: no retry")
	mu.Unlock()
	h = b.history(t, id)
	require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "PaymentApproved:early:RESERVE_INVENTORY>RESERVE_INVENTORY",
		"InventoryReserved:new:RESERVE_INVENTORY>SCHEDULE_SHIPPING"}, trail(h))
	require.Equal(t, event.MessageID, h[1].MessageID)
	require.Contains(t, h[2].Note, "PaymentApproved, recorded early for step AuthorizePayment, settles it")
	var parked int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_parked`).Scan(&parked))
	require.Zero(t, parked)
}

// TestEventForAStepPassedIsAudited: an external step's event for a saga that
// will never wait for it again (here: failed before reaching it) is not
// retried; it is audited as invalid, as before.
func TestEventForAStepPassedIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{externalPayment: true})
	id := b.start(t, "o-passed")
	require.Equal(t, sagadef.StateFailed, b.mustReply(t, id, msgInventoryFailed).State)
	_, err := b.reply(t, "", msg(msgPaymentApproved, "o-passed"), "")
	require.NoError(t, err)
	h := b.history(t, id)
	require.Equal(t, sagadef.ClassInvalid.String(), h[len(h)-1].Class)
	require.Equal(t, sagadef.StateFailed, b.status(t, id).State)
}

// TestEventBeforeItsSagaStarts: the event an external step waits for
// arrives before the saga exists (its start command was queued behind it,
// or sat in a retry tier). Found by business key, no saga: it is retried,
// not parked at once, and applied once the saga started and reached the
// step. Through a real consumer and queue: the event first, the start
// second; the reply that reaches the step is delivered once the saga exists.
func TestEventBeforeItsSagaStarts(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{externalPayment: true})
	// Directly: no saga for the key yet is a transient failure.
	_, err := b.reply(t, "", msg(msgPaymentApproved, "o-before"), "")
	require.ErrorIs(t, err, saga.ErrNotFound)
	require.Equal(t, retry.ClassTransient, retry.ClassOf(err))

	send := runQueue(t, b, "test.saga.before-start", b.engine.Handle)
	enveloped := func(m testMsg) message.Envelope {
		t.Helper()
		env, err := message.New(m, message.Meta{})
		require.NoError(t, err)
		return env
	}
	send(enveloped(msg(msgPaymentApproved, "o-before")))
	send(enveloped(msg(msgPlaceOrder, "o-before")))

	var st saga.Status
	require.Eventually(t, func() bool {
		st, err = b.engine.StatusByBusinessKey(context.Background(), "o-before")
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the saga starts")
	_, err = b.reply(t, st.ID, msg(msgInventoryReserved, "o-before"), st.PendingMessageID)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.status(t, st.ID).State == stShipping
	}, 30*time.Second, 20*time.Millisecond, "the early event is applied once the saga waits for it")
	var parked int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_parked`).Scan(&parked))
	require.Zero(t, parked)
}

// runQueue runs a consumer of a quorum work queue of its own (one worker,
// one delivery at a time, a 100 ms retry tier and room for 50 attempts) with
// handler until the test ends, and returns a func that publishes to it.
func runQueue(t *testing.T, b *testBundle, queue string, handler consumer.HandlerFunc) func(message.Envelope) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	quiet := slog.New(slog.DiscardHandler)
	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	consume, publish := dial("consume"), dial("publish")
	policy := retry.Policy{Tiers: []time.Duration{100 * time.Millisecond}, MaxAttempts: 50}
	ch, err := publish.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{Queues: broker.WorkQueue(queue, broker.QueueQuorum, policy)}))
	require.NoError(t, ch.Confirm(false))
	c, err := consumer.New(consumer.Config{Name: queue, Queue: queue, Pool: b.pool, Conn: consume, PublishConn: publish,
		Registry: testRegistry, Retry: policy, Concurrency: 1, BatchSize: 1, Prefetch: 1, Logger: quiet, Handler: handler})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(env message.Envelope) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, env.Publishing())
		require.NoError(t, err)
		require.True(t, dc.Wait(), "publish %s", env.MessageID)
	}
}

// TestEventInReviewWaitsForTheRetry: the event an external step waits for
// (the payment approval) arrives while the saga is in manual review at the
// step before it (the reservation timed out and went to review). Only an
// operator moves the saga on, so retrying the event through the consumer's
// tiers would end in the parking lot while the resumed saga waits for it.
// Through a real consumer and queue: the event is recorded in the saga on
// its first delivery (audited early, nothing parked); after the operator's
// retry and the reservation's reply, the recorded approval settles the
// payment step at once and the saga goes on to shipping.
func TestEventInReviewWaitsForTheRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{externalPayment: true, reserveTimeout: sagadef.TimeoutManualReview})
	ctx := context.Background()
	id := b.start(t, "o-review")
	b.clock.Advance(stepTimeout)
	require.Equal(t, 1, b.fire(t))
	inReview := b.status(t, id)
	require.Equal(t, stManualReview, inReview.State)

	send := runQueue(t, b, "test.saga.in-review", b.engine.Handle)
	event, err := message.New(msg(msgPaymentApproved, "o-review"), message.Meta{})
	require.NoError(t, err)
	send(event)
	var h []saga.AuditRecord
	require.Eventually(t, func() bool {
		h = b.history(t, id)
		return h[len(h)-1].MessageID == event.MessageID
	}, 30*time.Second, 20*time.Millisecond, "the event is handled")
	recorded := h[len(h)-1]
	require.Equal(t, sagadef.ClassEarly.String(), recorded.Class)
	require.Equal(t, stManualReview, recorded.From)
	require.Equal(t, stManualReview, recorded.To)
	require.Contains(t, recorded.Note, "recorded early")
	st := b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	require.Equal(t, inReview.Version+1, st.Version, "recorded in the saga")

	st, err = b.engine.Retry(ctx, id, st.Version, "alice", "inventory service is back")
	require.NoError(t, err)
	require.Equal(t, stReserve, st.State)
	st = b.mustReply(t, id, msgInventoryReserved)
	require.Equal(t, stShipping, st.State, "the recorded approval settles the payment step")
	require.Equal(t, []string{"ReserveInventory", "ReserveInventory", "ScheduleShipping"}, outboxTypes(b.outbox(t, id)))
	h = b.history(t, id)
	require.Equal(t, []string{"start:new:>" + stReserve, "timeout:new:" + stReserve + ">" + stManualReview,
		"PaymentApproved:early:" + stManualReview + ">" + stManualReview,
		"operator.retry:new:" + stManualReview + ">" + stReserve,
		"InventoryReserved:new:" + stReserve + ">" + stShipping}, trail(h))

	var parked int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_parked`).Scan(&parked))
	require.Zero(t, parked)
}
