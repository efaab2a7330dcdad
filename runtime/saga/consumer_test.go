package saga_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestConsumerBatchWithTwoMessagesForOneSaga runs the engine behind a real
// consumer and relay: one batch on the consumer's fast path carries a reply,
// the participant's resend of it (a new message id, as after a participant
// crash) and a reply for another saga. The first advances its saga once, the
// resend is audited as a duplicate and changes nothing, the other saga
// advances, and the commands the batch wrote are handed to the relay and
// published once each.
func TestConsumerBatchWithTwoMessagesForOneSaga(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	quiet := slog.New(slog.DiscardHandler)
	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	consume, publish := dial("consume"), dial("publish")
	const queue, sink = "test.saga.replies", "test.commands.sink"
	ch, err := publish.Channel(ctx)
	require.NoError(t, err)
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: msgReserveInventory.Exchange, Kind: "direct"}},
		Queues:    append(broker.WorkQueue(queue, broker.QueueQuorum, retry.Default()), broker.Queue{Name: sink}),
	}
	for _, in := range []string{msgReserveInventory.RoutingKey, msgAuthorizePayment.RoutingKey} {
		top.Bindings = append(top.Bindings, broker.Binding{Queue: sink, Exchange: msgReserveInventory.Exchange, RoutingKey: in})
	}
	require.NoError(t, broker.Declare(ctx, ch, top))
	require.NoError(t, ch.Confirm(false))

	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	var (
		mu      sync.Mutex
		gateID  string
		batchOf = map[string]int{} // message id → deliveries in its fast-path batch
	)
	handler := func(hctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		mu.Lock()
		isGate := d.Envelope.MessageID == gateID
		mu.Unlock()
		if isGate {
			entered <- struct{}{}
			<-gate
		}
		return b.engine.Handle(hctx, tx, d)
	}
	// The engine's HandleBatch with the gate in its handler.
	batch := batchFunc(func(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
		mu.Lock()
		for _, d := range ds {
			batchOf[d.Envelope.MessageID] = len(ds)
		}
		mu.Unlock()
		if err := b.engine.LockBatchForTest(ctx, tx, ds); err != nil {
			return consumer.FailBatch(ds, err)
		}
		return consumer.HandlerFunc(handler).HandleBatch(ctx, tx, ds)
	})
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: publish, PollInterval: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{Name: "test-saga", Queue: queue, Pool: b.pool, Conn: consume, PublishConn: publish,
		Registry: testRegistry, Batch: batch, Relay: relay, Concurrency: 1, BatchSize: 8, Logger: quiet})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{c.Run, relay.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("run: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	send := func(env message.Envelope) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, env.Publishing())
		require.NoError(t, err)
		require.True(t, dc.Wait(), "publish %s", env.MessageID)
	}
	replyTo := func(id string) message.Envelope {
		t.Helper()
		st := b.status(t, id)
		env, err := message.New(msg(msgInventoryReserved, st.BusinessKey), message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: st.PendingMessageID})
		require.NoError(t, err)
		return env
	}

	// The gate holds the consumer's only worker while the batch queues up
	// behind it in the consumer's prefetch.
	gated := replyTo(b.start(t, "o-gate"))
	mu.Lock()
	gateID = gated.MessageID
	mu.Unlock()
	send(gated)
	<-entered
	one, two := b.start(t, "o-1"), b.start(t, "o-2")
	first := replyTo(one)
	resend, err := message.New(msg(msgInventoryReserved, "o-1"), message.Meta{SagaID: one, SagaType: b.def.Name, CausationID: first.CausationID})
	require.NoError(t, err)
	other := replyTo(two)
	for _, env := range []message.Envelope{first, resend, other} {
		send(env)
	}
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(t, err)
		return q.Messages == 0
	}, 30*time.Second, 10*time.Millisecond, "the consumer takes the three replies")
	time.Sleep(200 * time.Millisecond) // for the deliveries in flight to reach its buffer
	close(gate)

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_inbox WHERE consumer = 'test-saga'`).Scan(&n))
		return n == 4
	}, 30*time.Second, 20*time.Millisecond, "all four replies claimed")
	mu.Lock()
	require.Equal(t, map[string]int{gated.MessageID: 1, first.MessageID: 3, resend.MessageID: 3, other.MessageID: 3}, batchOf,
		"the gate alone, then the three replies in one fast-path batch")
	mu.Unlock()

	st := b.status(t, one)
	require.Equal(t, stPayment, st.State)
	require.EqualValues(t, 2, st.Version, "advanced once")
	require.Equal(t, []string{"InventoryReserved"}, applied(t, st))
	h := b.history(t, one)
	require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "InventoryReserved:new:RESERVE_INVENTORY>AUTHORIZE_PAYMENT",
		"InventoryReserved:duplicate:AUTHORIZE_PAYMENT>AUTHORIZE_PAYMENT"}, trail(h))
	require.Equal(t, sagadef.ClassDuplicate.String(), h[2].Class)
	require.Equal(t, resend.MessageID, h[2].MessageID)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, one)))
	require.Equal(t, stPayment, b.status(t, two).State)
	require.EqualValues(t, 2, b.status(t, two).Version)

	// Every command the three sagas sent is published once: the starts'
	// by a claim, the batch's handed over after its commit.
	var published []string
	deadline := time.Now().Add(30 * time.Second)
	for len(published) < 6 && time.Now().Before(deadline) {
		d, ok, err := ch.Get(sink, true)
		require.NoError(t, err)
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		published = append(published, d.Type+" "+d.Headers[message.HeaderSagaID].(string))
	}
	require.ElementsMatch(t, []string{
		msgReserveInventory.FullName + " " + gated.SagaID, msgAuthorizePayment.FullName + " " + gated.SagaID,
		msgReserveInventory.FullName + " " + one, msgAuthorizePayment.FullName + " " + one,
		msgReserveInventory.FullName + " " + two, msgAuthorizePayment.FullName + " " + two,
	}, published)
	time.Sleep(200 * time.Millisecond)
	_, ok, err := ch.Get(sink, true)
	require.NoError(t, err)
	require.False(t, ok, "nothing published twice")
	require.EqualValues(t, 3, relay.Stats().HandedOff, "the batches' commands went to the relay without a claim")
}

// batchFunc is a function as a consumer.BatchHandler.
type batchFunc func(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error

func (f batchFunc) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
	return f(ctx, tx, ds)
}
