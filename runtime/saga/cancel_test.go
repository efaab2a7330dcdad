package saga_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestCancelThroughTheBroker requests business cancels the way application
// code does (Engine.RequestCancel writes the cancel message to the outbox)
// and lets the relay publish them to RabbitMQ and the saga's consumer
// deliver them to the engine. A saga waiting on the pivot compensates its
// reserved inventory and ends CANCELLED, its audit row naming who asked
// and why; a saga past the pivot refuses the cancel, audited, unchanged.
func TestCancelThroughTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{cancel: true})
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	quiet := slog.New(slog.DiscardHandler)
	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	consume, publish := dial("consume"), dial("publish")
	const queue, sink = "test.saga.place-order", "test.commands.sink"
	ch, err := publish.Channel(ctx)
	require.NoError(t, err)
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: msgCancelOrder.Exchange, Kind: "direct"}, {Name: msgReserveInventory.Exchange, Kind: "direct"}},
		Queues:    append(broker.WorkQueue(queue, broker.QueueQuorum, retry.Default()), broker.Queue{Name: sink}),
		Bindings:  []broker.Binding{{Queue: queue, Exchange: msgCancelOrder.Exchange, RoutingKey: msgCancelOrder.RoutingKey}},
	}
	for _, in := range []string{msgReserveInventory.RoutingKey, msgReleaseInventory.RoutingKey, msgAuthorizePayment.RoutingKey, msgScheduleShipping.RoutingKey} {
		top.Bindings = append(top.Bindings, broker.Binding{Queue: sink, Exchange: msgReserveInventory.Exchange, RoutingKey: in})
	}
	require.NoError(t, broker.Declare(ctx, ch, top))

	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: publish, PollInterval: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{Name: "test-saga", Queue: queue, Pool: b.pool, Conn: consume, PublishConn: publish,
		Registry: testRegistry, Handler: b.engine.Handle, Relay: relay, Logger: quiet})
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
	t.Cleanup(func() { stop(); wg.Wait() })

	// cancelled waits for the audit row of the cancel with the given
	// message id, which the consumer writes once the broker delivered it.
	cancelled := func(sagaID, messageID string) saga.AuditRecord {
		t.Helper()
		var rec saga.AuditRecord
		require.Eventually(t, func() bool {
			h := b.history(t, sagaID)
			i := slices.IndexFunc(h, func(a saga.AuditRecord) bool { return a.MessageID == messageID })
			if i >= 0 {
				rec = h[i]
			}
			return i >= 0
		}, 30*time.Second, 20*time.Millisecond, "the cancel %s reaches saga %s through the broker", messageID, sagaID)
		var claimed bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM saga_inbox WHERE consumer = 'test-saga' AND message_id = $1)`,
			messageID).Scan(&claimed))
		require.True(t, claimed, "the consumer took the cancel from the queue")
		return rec
	}

	// Mid-saga: inventory reserved, payment (the pivot) pending.
	mid := b.start(t, "o-mid")
	b.mustReply(t, mid, msgInventoryReserved)
	before := b.status(t, mid)
	require.Equal(t, stPayment, before.State)
	cancelID, err := b.engine.RequestCancel(ctx, cancelOrder("o-mid", "alice@example.com", "customer changed her mind"), message.Meta{})
	require.NoError(t, err)
	rec := cancelled(mid, cancelID)
	require.Equal(t, msgCancelOrder.FullName, rec.Trigger)
	require.Equal(t, sagadef.ClassNew.String(), rec.Class)
	require.Equal(t, stPayment, rec.From)
	require.Equal(t, stCompReserve, rec.To)
	require.Equal(t, "alice@example.com", rec.Operator, "the audit row names who asked")
	require.Equal(t, 1, strings.Count(rec.Note, "customer changed her mind"), "and why, once: %s", rec.Note)
	st := b.status(t, mid)
	require.Equal(t, stCompReserve, st.State)
	require.Equal(t, &sagadef.Cancellation{RequestedBy: "alice@example.com", Reason: "customer changed her mind", MessageID: cancelID}, st.Progress.Cancel)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}, outboxTypes(b.outbox(t, mid)),
		"the reserved inventory is released")
	st = b.mustReply(t, mid, msgInventoryReleased)
	require.Equal(t, stCancelled, st.State)
	require.Equal(t, saga.PhaseCancelled, st.Phase())
	require.Equal(t, []string{"InventoryReserved", "CancelOrder", "InventoryReleased"}, applied(t, st))
	require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "InventoryReserved:new:RESERVE_INVENTORY>AUTHORIZE_PAYMENT",
		"CancelOrder:new:AUTHORIZE_PAYMENT>COMPENSATING_RESERVE_INVENTORY",
		"InventoryReleased:new:COMPENSATING_RESERVE_INVENTORY>CANCELLED"}, trail(b.history(t, mid)))

	// Past the pivot: refused, audited, nothing changes.
	late := b.start(t, "o-late")
	b.mustReply(t, late, msgInventoryReserved)
	before = b.mustReply(t, late, msgPaymentAuthorized)
	require.Equal(t, stShipping, before.State)
	refusedID, err := b.engine.RequestCancel(ctx, cancelOrder("o-late", "bob@example.com", "too slow"), message.Meta{})
	require.NoError(t, err)
	rec = cancelled(late, refusedID)
	require.Equal(t, sagadef.ClassLate.String(), rec.Class)
	require.Equal(t, stShipping, rec.From)
	require.Equal(t, stShipping, rec.To)
	require.Equal(t, "bob@example.com", rec.Operator)
	require.Equal(t, 1, strings.Count(rec.Note, "too slow"), "the reason, once: %s", rec.Note)
	require.Contains(t, rec.Note, "refused: pivot step AuthorizePayment completed, past the point of no return")
	after := b.status(t, late)
	require.Equal(t, before.Version, after.Version, "a refused cancel changes nothing")
	require.Equal(t, stShipping, after.State)
	require.Nil(t, after.Progress.Cancel)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping"}, outboxTypes(b.outbox(t, late)))
}

// TestRequestCancelChecks: RequestCancelTx writes only the definition's
// cancel message, and only one that can find its saga.
func TestRequestCancelChecks(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{cancel: true})
	ctx := context.Background()
	_, err := b.engine.RequestCancel(ctx, msg(msgPlaceOrder, "o-1"), message.Meta{})
	require.ErrorIs(t, err, saga.ErrNoCancel)
	require.ErrorContains(t, err, "test.order.v1.PlaceOrder is not its cancel message test.order.v1.CancelOrder")
	_, err = b.engine.RequestCancel(ctx, cancelOrder("", "x", "y"), message.Meta{})
	require.ErrorIs(t, err, saga.ErrNoCancel)
	require.ErrorContains(t, err, "no correlation key")
	_, err = b.engine.RequestCancel(ctx, nil, message.Meta{})
	require.ErrorIs(t, err, saga.ErrNoCancel)

	plain := b.newEngine(t, func(c *saga.Config) { c.Definition = placeOrder(t, "saga_place_order", defOptions{}) })
	_, err = plain.RequestCancel(ctx, cancelOrder("o-1", "x", "y"), message.Meta{})
	require.ErrorIs(t, err, saga.ErrNoCancel)
	require.ErrorContains(t, err, "declares no cancel message")

	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox`).Scan(&n))
	require.Zero(t, n, "nothing refused was written")

	id, err := b.engine.RequestCancel(ctx, cancelOrder("o-1", "x", "y"), message.Meta{})
	require.NoError(t, err)
	var typ, corr string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT message_type, correlation_id FROM saga_outbox WHERE message_id = $1`, id).Scan(&typ, &corr))
	require.Equal(t, msgCancelOrder.FullName, typ)
}
