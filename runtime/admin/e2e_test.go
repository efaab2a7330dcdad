package admin_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
)

// runBroker declares the Place Order topology on a fresh vhost and runs the
// outbox relay and the saga's reply consumer (one worker, one delivery per
// transaction, so deliveries are handled in queue order) until the test ends.
func (b *bundle) runBroker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	consume, publish := dial("consume"), dial("publish")
	ch, err := consume.Channel(ctx)
	require.NoError(t, err)
	top := orderv1.Topology().Merge(inventoryv1.Topology()).Merge(paymentv1.Topology()).Merge(shippingv1.Topology())
	require.NoError(t, broker.Declare(ctx, ch, top))
	require.NoError(t, ch.Close())

	quiet := slog.New(slog.DiscardHandler)
	c, err := consumer.New(consumer.Config{Name: "order-saga", Queue: "order.saga.place_order", Pool: b.pool, Conn: consume,
		PublishConn: publish, Registry: b.engine.Registry(), Handler: b.engine.Handle, Concurrency: 1, BatchSize: 1, Logger: quiet})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: publish, PollInterval: 50 * time.Millisecond, Logger: quiet})
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
}

// publishReply writes a participant's reply to the outbox, as
// participant.Handler would.
func (b *bundle) publishReply(t *testing.T, env message.Envelope) {
	t.Helper()
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	require.NoError(t, outbox.Enqueue(t.Context(), tx, env))
	require.NoError(t, tx.Commit(t.Context()))
}

func (b *bundle) awaitState(t *testing.T, id, state string) {
	t.Helper()
	require.Eventually(t, func() bool { return b.status(t, id).State == state }, 30*time.Second, 20*time.Millisecond,
		"saga %s never reached %s", id, state)
}

// The demo's story end to end: a reply is parked because of a bug; the bug
// is fixed; the operator replays the parked message; it goes out through the
// relay and broker, the consumer applies it once. Replaying a message that
// was already applied has no second effect.
func TestReplayEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.runBroker(t)
	b.broken.Store(true)

	id := b.start(t, "order-e2e")
	reply := &inventoryv1.InventoryReserved{OrderId: "order-e2e"}
	env := b.replyEnvelope(t, id, reply)
	b.publishReply(t, env)

	var pid int64
	require.Eventually(t, func() bool {
		page := getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id)
		if len(page.Items) == 0 {
			return false
		}
		pid = page.Items[0].ID
		return true
	}, 30*time.Second, 20*time.Millisecond, "the consumer parks the reply")
	p := getJSON[admin.Parked](t, b, "/api/parked/"+itoa(pid))
	require.Equal(t, env.MessageID, p.MessageID)
	require.Equal(t, "order.saga.place_order", p.Queue)
	require.Contains(t, p.Reason, "bug in OnInventoryReserved")
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, id).State)

	b.broken.Store(false) // the fix is deployed
	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: "fold fixed in v1.2.3"}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	b.awaitState(t, id, "AUTHORIZE_PAYMENT")
	var applied int
	countApplied := func() int {
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_audit WHERE message_id = $1 AND trigger = $2`,
			env.MessageID, "shop.inventory.v1.InventoryReserved").Scan(&applied))
		return applied
	}
	require.Equal(t, 1, countApplied())

	again := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: "double click"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyReplay, again.Outcome)

	// Manual replay of an already-applied message: a stray parked copy,
	// forced past the check, reaches the consumer and is dropped by the inbox.
	stray := b.park(t, env, "order.saga.place_order", "stray copy")
	v := b.status(t, id).Version
	forced := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(stray)+"/replay", admin.ReplayRequest{Reason: "prove it is harmless", Force: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, forced.Outcome)
	require.Equal(t, "duplicate", forced.Check.Class)
	// A later message through the same queue: once it is applied, the
	// replayed copy (published before it, one worker) has been handled.
	id2 := b.start(t, "order-e2e-2")
	b.publishReply(t, b.replyEnvelope(t, id2, &inventoryv1.InventoryReserved{OrderId: "order-e2e-2"}))
	b.awaitState(t, id2, "AUTHORIZE_PAYMENT")
	require.Equal(t, 1, countApplied(), "no second effect: the inbox dropped the replayed copy")
	require.Equal(t, v, b.status(t, id).Version)
	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id).Items, "nothing parked again")
}
