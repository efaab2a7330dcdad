package chaos_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/examples/placeorder/app"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	"github.com/protosaga/saga/internal/chaos"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
)

// poison is one hostile message and what its parking reason must say.
type poison struct {
	name   string
	queue  string // published to it through the default exchange
	pub    amqp.Publishing
	reason string
}

// TestPoisonMessagesParkedWithoutSpinning sends malformed, truncated,
// oversized, wrong-type and wrong-version messages to the live consumers of
// a node process running the whole application. Each is parked at once with
// its reason; the process keeps running (it is never restarted) and keeps
// working (a saga started afterwards completes); and it does not spin: its
// CPU time over an idle window after the poison stays far below what a hot
// loop burns (a spin detector, not a speed assertion).
func TestPoisonMessagesParkedWithoutSpinning(t *testing.T) {
	t.Parallel()
	bin := soakBinary(t)
	pgURL, amqpURL := testenv.PostgresURL(t), testenv.AMQP(t)
	ctx := context.Background()

	fleet := chaos.NewFleet(bin, t.TempDir(), t.Logf)
	node := fleet.Add(ctx, chaos.NodeConfig{
		Name: "poison-target", PostgresURL: pgURL, AMQPURL: amqpURL, Roles: chaos.AllRoles(),
		Retry: retry.Policy{Tiers: []time.Duration{100 * time.Millisecond}, MaxAttempts: 3},
	}, nil)
	t.Cleanup(func() { fleet.Stop(20 * time.Second) })
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, node.WaitReady(readyCtx))
	pid := node.PID()

	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer pool.Close()

	reserve := &inventoryv1.ReserveInventory{OrderId: "o-poison", Lines: []*commonv1.OrderLine{{ProductId: "p", Quantity: 1}}}
	reserveEnv, err := message.New(reserve, message.Meta{})
	require.NoError(t, err)
	body, err := proto.Marshal(reserve)
	require.NoError(t, err)

	with := func(mutate func(p *amqp.Publishing)) amqp.Publishing {
		p := reserveEnv.Publishing()
		p.MessageId = uuid.NewString()
		p.Headers = amqp.Table{}
		for k, v := range reserveEnv.Publishing().Headers {
			p.Headers[k] = v
		}
		mutate(&p)
		return p
	}
	reply := func(sagaID string) amqp.Publishing {
		env, err := message.New(&inventoryv1.InventoryReserved{OrderId: "o-poison"}, message.Meta{SagaID: sagaID, CausationID: "c"})
		require.NoError(t, err)
		return env.Publishing()
	}
	stray, err := message.New(&paymentv1.PaymentAuthorized{OrderId: "o-poison"}, message.Meta{})
	require.NoError(t, err)

	inv, sagaQ := "inventory.commands", "order.saga.place_order"
	poisons := []poison{
		{"malformed body", inv, with(func(p *amqp.Publishing) { p.Body = []byte("\xff\xff\xff\xff not protobuf") }), "undecodable"},
		{"truncated body", inv, with(func(p *amqp.Publishing) { p.Body = body[:len(body)-2] }), "undecodable"},
		{"oversized body", inv, with(func(p *amqp.Publishing) { p.Body = bytes.Repeat([]byte{0xff}, 4<<20) }), "undecodable"},
		{"unknown type", inv, with(func(p *amqp.Publishing) { p.Type = "shop.inventory.v1.NoSuchCommand" }), "unknown message type"},
		{"wrong type for the queue", inv, withID(stray.Publishing()), "PaymentAuthorized"},
		{"newer schema version", inv, with(func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = int32(99) }), "schema version mismatch"},
		{"schema version not a number", inv, with(func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = "one" }), "invalid envelope"},
		{"missing type", inv, with(func(p *amqp.Publishing) { p.Type = "" }), "invalid envelope"},
		{"reply for no saga", sagaQ, withID(reply(uuid.NewString())), "not found"},
		{"reply with a malformed saga id", sagaQ, withID(reply("not-a-uuid")), "not a UUID"},
	}

	conn, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: "poisoner"})
	require.NoError(t, err)
	defer conn.Close()
	pub := broker.NewPublisher(conn, broker.PublisherConfig{})
	defer pub.Close()
	out := make([]broker.Outgoing, len(poisons))
	for i, p := range poisons {
		out[i] = broker.Outgoing{RoutingKey: p.queue, Publishing: p.pub}
	}
	for i, err := range pub.Publish(ctx, out) {
		require.NoError(t, err, poisons[i].name)
	}

	for _, p := range poisons {
		var class, reason string
		var attempts int
		require.Eventually(t, func() bool {
			err := pool.QueryRow(ctx, `SELECT class, reason, attempts FROM saga_parked WHERE message_id = $1`,
				p.pub.MessageId).Scan(&class, &reason, &attempts)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "%s was not parked", p.name)
		t.Logf("%s: parked (%s): %.200s", p.name, class, reason)
		require.Contains(t, reason, p.reason, p.name)
		require.Equal(t, "permanent", class, p.name)
		require.Equal(t, 1, attempts, "%s: parked at once, never retried", p.name)
	}

	// Spin detector: the node's CPU time over 3 s of idleness after the
	// poison. A hot loop burns a whole core; an idle node a few percent.
	time.Sleep(time.Second) // let the parking publishes and logs finish
	before, err := chaos.CPUTime(pid)
	require.NoError(t, err)
	time.Sleep(3 * time.Second)
	after, err := chaos.CPUTime(pid)
	require.NoError(t, err)
	t.Logf("node CPU over 3 s of idleness: %s", after-before)
	require.Less(t, after-before, 1500*time.Millisecond, "the node burned %s of CPU in 3 s of idleness", after-before)

	// It keeps working: a saga started now completes, in the same process.
	_, err = pool.Exec(ctx, `INSERT INTO inventory_stock (product_id, available) VALUES ('p', 10)`)
	require.NoError(t, err)
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool, Logger: slog.New(slog.DiscardHandler)}, app.Decider{})
	require.NoError(t, err)
	sagaID, _, err := po.Start(ctx, &orderv1.PlaceOrderRequest{
		OrderId: "o-after-poison", Lines: []*commonv1.OrderLine{{ProductId: "p", Quantity: 1}},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 100},
		ShippingAddress: &commonv1.Address{Country: "FR"}, CardToken: "tok_visa",
	}, message.Meta{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := po.GetByID(ctx, sagaID)
		return err == nil && st.State == orderv1.PlaceOrderStateCompleted
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, pid, node.PID(), "the node was restarted")
	_, _, starts := fleet.Counts()
	require.Equal(t, 1, starts, "the node died and was restarted")
}

func withID(p amqp.Publishing) amqp.Publishing {
	p.MessageId = uuid.NewString()
	return p
}
