package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/examples/placeorder/internal/script"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/audittest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
)

// Message names the script and the assertions refer to.
var (
	reserveInventory = inventoryv1.ReserveInventoryInfo.FullName
	authorizePayment = paymentv1.AuthorizePaymentInfo.FullName
	scheduleShipping = shippingv1.ScheduleShippingInfo.FullName
)

// waitFor bounds every wait on the fleet; the whole test stays far below it.
const waitFor = 30 * time.Second

// clock is the saga engine's clock: real time plus an offset the test moves
// forward to fire step timeouts.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

type testBundle struct {
	host       *host.Host
	placeOrder *orderv1.PlaceOrder
	pool       *pgxpool.Pool
	amqpURL    string
	clock      *clock
	script     *script.Script
	manifests  *app.CarrierManifests
	stop       func() error // stops the host and returns its error (once)
}

// config is the test fleet's host configuration: short retry tiers, a fast
// timeout scanner, the script's faults and the test's clock.
func (b *testBundle) config() host.Config {
	return host.Config{
		Service:               "placeorder-test",
		Pool:                  b.pool,
		AMQPURL:               b.amqpURL,
		HTTPAddr:              "127.0.0.1:0",
		Concurrency:           2,
		BatchSize:             8,
		Retry:                 retry.Policy{Tiers: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, MaxAttempts: 4},
		TimeoutScanInterval:   100 * time.Millisecond,
		DrainTimeout:          5 * time.Second,
		Now:                   b.clock.Now,
		ParticipantMiddleware: b.script.Middleware,
		Logger:                slog.New(slog.DiscardHandler),
	}
}

// setup runs one Place Order fleet on a fresh schema and vhost: the example
// registered on a started host.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	b := &testBundle{pool: testenv.Postgres(t), amqpURL: testenv.AMQP(t), clock: &clock{}, script: script.New(),
		manifests: app.NewCarrierManifests()}
	h, err := host.New(ctx, b.config())
	require.NoError(t, err)
	b.placeOrder, err = app.RegisterWithManifests(h, b.manifests)
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	b.host = h
	for p, n := range map[string]int32{"widget": 1000, "gadget": 1000, "sold-out": 0} {
		require.NoError(t, app.Restock(ctx, b.pool, p, n))
	}
	var once sync.Once
	var stopErr error
	b.stop = func() error {
		once.Do(func() {
			stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			stopErr = h.Stop(stopCtx)
		})
		return stopErr
	}
	t.Cleanup(func() { require.NoError(t, b.stop()) })
	return b
}

func request(orderID string) *orderv1.PlaceOrderRequest {
	return &orderv1.PlaceOrderRequest{
		OrderId:    orderID,
		CustomerId: "c-1",
		Lines: []*commonv1.OrderLine{
			{ProductId: "widget", Quantity: 2},
			{ProductId: "gadget", Quantity: 1},
		},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 4999},
		ShippingAddress: &commonv1.Address{Name: "A. Customer", Street: "1 Main St", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       "tok_visa",
	}
}

func (b *testBundle) start(t *testing.T, req *orderv1.PlaceOrderRequest) string {
	t.Helper()
	id, created, err := b.placeOrder.Start(context.Background(), req, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

// wait polls the saga until ok accepts its snapshot.
func (b *testBundle) wait(t *testing.T, sagaID, what string, ok func(*orderv1.PlaceOrderSnapshot) bool) *orderv1.PlaceOrderSnapshot {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.placeOrder.GetByID(context.Background(), sagaID)
		require.NoError(t, err)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %s (%s): waited %s for %s; it is in %s (last error %q, review reason %q); audit:\n%s",
				sagaID, st.BusinessKey, waitFor, what, st.State, st.LastError, st.ReviewReason, b.auditText(t, sagaID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *testBundle) waitState(t *testing.T, sagaID string, state orderv1.PlaceOrderState) *orderv1.PlaceOrderSnapshot {
	t.Helper()
	return b.wait(t, sagaID, "state "+string(state), func(s *orderv1.PlaceOrderSnapshot) bool { return s.State == state })
}

// eventually polls cond (a database or script observation) until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitFor, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// step is one audit row, reduced to what the saga's path is made of.
type step struct{ From, To, Trigger, Class string }

var short = audittest.Short

func (b *testBundle) audit(t *testing.T, sagaID string) []saga.AuditRecord {
	return audittest.Audit(t, b.placeOrder.Engine(), sagaID)
}

func (b *testBundle) path(t *testing.T, sagaID string) []step {
	var out []step
	for _, s := range audittest.Path(t, b.placeOrder.Engine(), sagaID) {
		out = append(out, step(s))
	}
	return out
}

func (b *testBundle) auditText(t *testing.T, sagaID string) string {
	return audittest.AuditText(t, b.placeOrder.Engine(), sagaID)
}

// ledger returns the order's business effects, oldest first, as
// "service:effect".
func (b *testBundle) ledger(t *testing.T, orderID string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT service || ':' || effect FROM shop_ledger WHERE order_id = $1 ORDER BY id`, orderID)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return effects
}

// outbox returns the message types the saga and its participants wrote to
// the outbox for sagaID, oldest first, after checking every row of the whole
// outbox was published.
func (b *testBundle) outbox(t *testing.T, sagaID string) []string {
	t.Helper()
	ctx := context.Background()
	eventually(t, "every outbox row to be published", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL`).Scan(&n))
		return n == 0
	})
	rows, err := b.pool.Query(ctx, `SELECT message_type FROM saga_outbox WHERE saga_id = $1 ORDER BY id`, sagaID)
	require.NoError(t, err)
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for i := range types {
		types[i] = short(types[i])
	}
	return types
}

func (b *testBundle) parkedCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_parked`).Scan(&n))
	return n
}

// completedPath is the audit trail of a saga that went straight through.
var completedPath = []step{
	{"", "RESERVE_INVENTORY", "start", "new"},
	{"RESERVE_INVENTORY", "AUTHORIZE_PAYMENT", "InventoryReserved", "new"},
	{"AUTHORIZE_PAYMENT", "SCHEDULE_SHIPPING", "PaymentAuthorized", "new"},
	{"SCHEDULE_SHIPPING", "APPROVE_ORDER", "ShippingScheduled", "new"},
	{"APPROVE_ORDER", "COMPLETED", "OrderApproved", "new"},
}

var completedLedger = []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}

var completedOutbox = []string{
	"ReserveInventory", "InventoryReserved", "AuthorizePayment", "PaymentAuthorized",
	"ScheduleShipping", "ShippingScheduled", "ApproveOrder", "OrderApproved",
}

// TestPlaceOrder runs one fleet through the happy path and every failure that
// needs no clock: business failures with and without compensation, a
// transiently failing participant, a duplicate reply and a poison message.
// The sagas run concurrently, with the poison message in their midst.
func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)

	noStock := request("o-no-stock")
	noStock.Lines = []*commonv1.OrderLine{{ProductId: "widget", Quantity: 1}, {ProductId: "sold-out", Quantity: 1}}
	declined := request("o-declined")
	declined.CardToken = app.DeclinedCard
	b.script.FailTransiently("o-flaky-shipping", scheduleShipping, 2)
	b.script.DuplicateReplies("o-duplicate", authorizePayment)

	ids := map[string]string{}
	for _, req := range []*orderv1.PlaceOrderRequest{
		request("o-happy"), noStock, declined, request("o-flaky-shipping"), request("o-duplicate"),
	} {
		ids[req.GetOrderId()] = b.start(t, req)
	}
	b.publishPoison(t, "poison-1")
	ids["o-after-poison"] = b.start(t, request("o-after-poison"))

	t.Run("HappyPath", func(t *testing.T) {
		id := ids["o-happy"]
		st := b.waitState(t, id, orderv1.PlaceOrderStateCompleted)
		require.Equal(t, completedPath, b.path(t, id))
		require.Equal(t, completedLedger, b.ledger(t, "o-happy"))
		require.Equal(t, completedOutbox, b.outbox(t, id))
		data := st.Data
		require.True(t, strings.HasPrefix(data.GetAuthorizationId(), "auth_"), data.GetAuthorizationId())
		require.True(t, strings.HasPrefix(data.GetTrackingId(), "trk_"), data.GetTrackingId())
		require.Contains(t, b.manifests.Orders("Colis Rapide"), "o-happy", "shipping put the order on its carrier's manifest")
	})

	t.Run("InventoryFailureFailsWithNothingReleased", func(t *testing.T) {
		id := ids["o-no-stock"]
		st := b.waitState(t, id, orderv1.PlaceOrderStateFailed)
		require.Equal(t, []step{
			{"", "RESERVE_INVENTORY", "start", "new"},
			{"RESERVE_INVENTORY", "FAILED", "InventoryReservationFailed", "new"},
		}, b.path(t, id))
		require.Equal(t, []string{"inventory:reservation_refused"}, b.ledger(t, "o-no-stock"))
		require.Equal(t, []string{"ReserveInventory", "InventoryReservationFailed"}, b.outbox(t, id))
		require.Contains(t, st.Data.GetFailureReason(), "out of stock: sold-out")
		var widgetsHeld int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM inventory_reservations WHERE order_id = 'o-no-stock'`).Scan(&widgetsHeld))
		require.Zero(t, widgetsHeld, "a refused reservation holds no line at all")
	})

	t.Run("PaymentFailureReleasesInventory", func(t *testing.T) {
		id := ids["o-declined"]
		st := b.waitState(t, id, orderv1.PlaceOrderStateFailed)
		require.Equal(t, []step{
			{"", "RESERVE_INVENTORY", "start", "new"},
			{"RESERVE_INVENTORY", "AUTHORIZE_PAYMENT", "InventoryReserved", "new"},
			{"AUTHORIZE_PAYMENT", "COMPENSATING_RESERVE_INVENTORY", "PaymentAuthorizationFailed", "new"},
			{"COMPENSATING_RESERVE_INVENTORY", "FAILED", "InventoryReleased", "new"},
		}, b.path(t, id))
		// Compensation after the failure, exactly for the completed step.
		require.Equal(t, []string{"inventory:reserved", "payment:declined", "inventory:released"}, b.ledger(t, "o-declined"))
		require.Equal(t, []string{
			"ReserveInventory", "InventoryReserved", "AuthorizePayment", "PaymentAuthorizationFailed",
			"ReleaseInventory", "InventoryReleased",
		}, b.outbox(t, id))
		require.Equal(t, "payment: card declined", st.Data.GetFailureReason())
		var held int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM inventory_reservations WHERE order_id = 'o-declined' AND released_at IS NULL`).Scan(&held))
		require.Zero(t, held, "every line is released")
	})

	t.Run("ShippingRetriedUntilItSucceeds", func(t *testing.T) {
		id := ids["o-flaky-shipping"]
		b.waitState(t, id, orderv1.PlaceOrderStateCompleted)
		require.Equal(t, completedPath, b.path(t, id))
		require.Equal(t, completedLedger, b.ledger(t, "o-flaky-shipping"))
		// Two scripted failures, then success: three deliveries of one
		// command through the retry tiers, and no resend by the saga.
		require.Equal(t, 3, b.script.Deliveries("o-flaky-shipping", scheduleShipping))
		require.Equal(t, completedOutbox, b.outbox(t, id))
	})

	t.Run("DuplicateReplyIsAuditedWithoutEffect", func(t *testing.T) {
		id := ids["o-duplicate"]
		b.waitState(t, id, orderv1.PlaceOrderStateCompleted)
		eventually(t, "the duplicate reply to be audited", func() bool {
			return slices.ContainsFunc(b.path(t, id), func(s step) bool { return s.Class == "duplicate" })
		})
		var applied, duplicate saga.AuditRecord
		transitions := 0
		for _, r := range b.audit(t, id) {
			if r.Class == "new" {
				transitions++
			}
			if short(r.Trigger) == "PaymentAuthorized" {
				switch r.Class {
				case "new":
					applied = r
				case "duplicate":
					duplicate = r
				}
			}
		}
		require.Equal(t, len(completedPath), transitions, "the duplicate changed nothing")
		require.NotEmpty(t, duplicate.MessageID)
		require.NotEqual(t, applied.MessageID, duplicate.MessageID, "a second message")
		require.Equal(t, applied.CausationID, duplicate.CausationID, "answering the same command")
		require.Equal(t, duplicate.From, duplicate.To)
		require.Equal(t, completedLedger, b.ledger(t, "o-duplicate"), "one authorization")
	})

	t.Run("PoisonMessageParkedWhileTheFleetKeepsRunning", func(t *testing.T) {
		ctx := context.Background()
		eventually(t, "the poison message to be parked", func() bool { return b.parkedCount(t) > 0 })
		var queue, class, reason, exchange, routingKey string
		var attempts int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT queue, class, reason, attempts, exchange, routing_key
FROM saga_parked WHERE message_id = 'poison-1'`).Scan(&queue, &class, &reason, &attempts, &exchange, &routingKey))
		require.Equal(t, "inventory.commands", queue)
		require.Equal(t, "permanent", class)
		require.Equal(t, 1, attempts, "parked at once, never retried")
		require.Contains(t, reason, "decode")
		require.Equal(t, inventoryv1.ReserveInventoryInfo.Exchange, exchange)
		require.Equal(t, inventoryv1.ReserveInventoryInfo.RoutingKey, routingKey)

		d := b.parkedDelivery(t, broker.ParkingQueue("inventory.commands"))
		require.Equal(t, "poison-1", d.MessageId)
		parkReason, _, err := message.HeaderString(d.Headers, message.HeaderParkReason)
		require.NoError(t, err)
		require.Contains(t, parkReason, "decode")
		origQueue, _, err := message.HeaderString(d.Headers, message.HeaderOrigQueue)
		require.NoError(t, err)
		require.Equal(t, "inventory.commands", origQueue)

		// The inventory consumer went on: a saga started after the poison
		// message completes.
		id := ids["o-after-poison"]
		b.waitState(t, id, orderv1.PlaceOrderStateCompleted)
		require.Equal(t, completedLedger, b.ledger(t, "o-after-poison"))
	})

	t.Run("NothingElseParkedOrStuck", func(t *testing.T) {
		require.Equal(t, 1, b.parkedCount(t), "only the poison message")
		for order, id := range ids {
			st, err := b.placeOrder.Status(context.Background(), id)
			require.NoError(t, err)
			require.True(t, st.Terminal(), "%s is in %s", order, st.State)
		}
	})
}

// TestPlaceOrderTimeouts runs the clock-driven paths: a participant that
// never answers (the step times out and is compensated; its reply arrives
// late, after the release, and goes to manual review) and one that answers late, after
// the saga resent its command (the late reply is applied while the saga
// still waits; the answer to the resend is a duplicate).
func TestPlaceOrderTimeouts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	b.script.HoldReplies("o-silent-inventory", reserveInventory)
	b.script.HoldReplies("o-slow-payment", authorizePayment)
	silent := b.start(t, request("o-silent-inventory"))
	slow := b.start(t, request("o-slow-payment"))

	// Both participants applied their effect and kept their reply.
	eventually(t, "the inventory reply to be held", func() bool { return b.script.Held("o-silent-inventory") == 1 })
	eventually(t, "the payment reply to be held", func() bool { return b.script.Held("o-slow-payment") == 1 })
	require.Equal(t, orderv1.PlaceOrderStateReserveInventory, b.waitState(t, silent, orderv1.PlaceOrderStateReserveInventory).State)
	st := b.waitState(t, slow, orderv1.PlaceOrderStateAuthorizePayment)
	require.Equal(t, 1, st.Attempt)

	// Past both step timeouts (30s for inventory, 1m for payment).
	b.clock.Advance(61 * time.Second)

	t.Run("TimeoutCompensates", func(t *testing.T) {
		b.waitState(t, silent, orderv1.PlaceOrderStateFailed)
		require.Equal(t, []step{
			{"", "RESERVE_INVENTORY", "start", "new"},
			{"RESERVE_INVENTORY", "COMPENSATING_RESERVE_INVENTORY", "timeout", "new"},
			{"COMPENSATING_RESERVE_INVENTORY", "FAILED", "InventoryReleased", "new"},
		}, b.path(t, silent))
		// The reservation the lost reply reported is released.
		require.Equal(t, []string{"inventory:reserved", "inventory:released"}, b.ledger(t, "o-silent-inventory"))
	})

	t.Run("TimeoutResendsWithoutSecondEffect", func(t *testing.T) {
		st := b.wait(t, slow, "the second attempt", func(s *orderv1.PlaceOrderSnapshot) bool { return s.Attempt == 2 })
		require.Equal(t, orderv1.PlaceOrderStateAuthorizePayment, st.State)
		eventually(t, "the resent command's reply to be held", func() bool { return b.script.Held("o-slow-payment") == 2 })
		require.Equal(t, 2, b.script.Deliveries("o-slow-payment", authorizePayment))
		require.Equal(t, []string{"inventory:reserved", "payment:authorized"}, b.ledger(t, "o-slow-payment"),
			"the resent command is answered from the first effect")
	})

	t.Run("LateReplyCoveredByCompensation", func(t *testing.T) {
		// The reservation's answer arrives after its release. The
		// inventory runs under the host's once-per-command guard (the
		// reply says so, x-saga-once), so its effect was in place before
		// the release ran, which undid it: audited, although the step's
		// policy is manual review. (A participant without the guard gets
		// the review: runtime/saga TestLateSuccessAfterCompensation.)
		sent, err := b.script.SendHeldReply(ctx, b.pool, "o-silent-inventory")
		require.NoError(t, err)
		require.True(t, sent)
		eventually(t, "the late reply to be audited", func() bool { return len(b.audit(t, silent)) == 4 })
		last := b.audit(t, silent)[3]
		require.Equal(t, step{"FAILED", "FAILED", "InventoryReserved", "late"},
			step{last.From, last.To, short(last.Trigger), last.Class})
		require.Contains(t, last.Note, "the compensation, sent after this attempt, undid its effect")
		st, err := b.placeOrder.GetByID(ctx, silent)
		require.NoError(t, err)
		require.Equal(t, orderv1.PlaceOrderStateFailed, st.State)
		require.Equal(t, last.Version, st.Version, "no change")
		require.Equal(t, []string{"inventory:reserved", "inventory:released"}, b.ledger(t, "o-silent-inventory"),
			"the release undid the reservation")
	})

	t.Run("LateReplyAppliedWhileWaiting", func(t *testing.T) {
		// The answer to the first attempt arrives while the saga waits for
		// the second: the step's policy (apply if waiting) applies it.
		sent, err := b.script.SendHeldReply(ctx, b.pool, "o-slow-payment")
		require.NoError(t, err)
		require.True(t, sent)
		b.wait(t, slow, "the late reply to be applied", func(s *orderv1.PlaceOrderSnapshot) bool {
			return s.State != orderv1.PlaceOrderStateAuthorizePayment
		})
		// The answer to the resend is then a duplicate.
		sent, err = b.script.SendHeldReply(ctx, b.pool, "o-slow-payment")
		require.NoError(t, err)
		require.True(t, sent)
		b.waitState(t, slow, orderv1.PlaceOrderStateCompleted)
		eventually(t, "the duplicate to be audited", func() bool {
			return slices.ContainsFunc(b.path(t, slow), func(s step) bool { return s.Class == "duplicate" })
		})
		var got []step
		for _, s := range b.path(t, slow) {
			if s.Trigger != "start" && s.Trigger != "InventoryReserved" {
				got = append(got, s)
			}
		}
		// Which of the two lands first after approval is not fixed; compare
		// without the rows after the payment's.
		require.Equal(t, []step{
			{"AUTHORIZE_PAYMENT", "AUTHORIZE_PAYMENT", "timeout", "new"},
			{"AUTHORIZE_PAYMENT", "SCHEDULE_SHIPPING", "PaymentAuthorized", "late"},
		}, got[:2])
		require.Contains(t, got, step{"SCHEDULE_SHIPPING", "APPROVE_ORDER", "ShippingScheduled", "new"})
		require.Contains(t, got, step{"APPROVE_ORDER", "COMPLETED", "OrderApproved", "new"})
		dup := got[slices.IndexFunc(got, func(s step) bool { return s.Class == "duplicate" })]
		require.Equal(t, "PaymentAuthorized", dup.Trigger)
		require.Equal(t, completedLedger, b.ledger(t, "o-slow-payment"), "one authorization for two attempts")
		require.Zero(t, b.parkedCount(t))
	})
}

// publishPoison publishes a ReserveInventory whose body is not protobuf
// straight to the inventory's command exchange, as a broken client would.
// waitNoConsumers waits until the broker lists no consumer on the queues:
// a stopping app's consumers cancel their subscriptions before they drain.
func (b *testBundle) waitNoConsumers(t *testing.T, queues ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := broker.Dial(ctx, b.amqpURL, broker.ConnConfig{Name: "observer"})
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	defer ch.Close()
	for _, q := range queues {
		require.Eventually(t, func() bool {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			require.NoError(t, err)
			return st.Consumers == 0
		}, waitFor, 10*time.Millisecond, "consumers of %s", q)
	}
}

func (b *testBundle) publishPoison(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	conn, err := broker.Dial(ctx, b.amqpURL, broker.ConnConfig{Name: "poisoner"})
	require.NoError(t, err)
	defer conn.Close()
	p := broker.NewPublisher(conn, broker.PublisherConfig{})
	defer p.Close()
	errs := p.Publish(ctx, []broker.Outgoing{{
		Exchange:   inventoryv1.ReserveInventoryInfo.Exchange,
		RoutingKey: inventoryv1.ReserveInventoryInfo.RoutingKey,
		Publishing: amqp.Publishing{
			MessageId:   id,
			Type:        reserveInventory,
			ContentType: message.ContentType,
			Headers:     amqp.Table{message.HeaderSchemaVersion: int32(1)},
			Body:        []byte("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff not protobuf"),
		},
	}})
	require.NoError(t, errs[0])
}

// parkedDelivery reads the first message of a parking lot and leaves it there.
func (b *testBundle) parkedDelivery(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(b.amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	var d amqp.Delivery
	eventually(t, "a message in "+queue, func() bool {
		var ok bool
		d, ok, err = ch.Get(queue, false)
		require.NoError(t, err)
		return ok
	})
	require.NoError(t, d.Nack(false, true))
	return d
}

// TestTopologyDefaultsToGenerated checks that with the default retry policy
// and queue type the host declares exactly the generated topology of the
// example's packages.
func TestTopologyDefaultsToGenerated(t *testing.T) {
	t.Parallel()
	h, err := host.New(context.Background(), host.Config{Pool: testenv.Postgres(t), AMQPURL: "amqp://unused/", HTTPAddr: host.HTTPOff})
	require.NoError(t, err)
	defer h.Close()
	_, err = app.Register(h)
	require.NoError(t, err)
	want, err := inventoryv1.Topology().Merge(paymentv1.Topology()).Merge(shippingv1.Topology()).Merge(orderv1.Topology()).DefinitionsJSON()
	require.NoError(t, err)
	got, err := h.Topology().DefinitionsJSON()
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))
}

// TestCompensationFailureGoesToManualReview: the compensation of a declined
// order keeps failing (a transient error every time), so each ReleaseInventory
// is retried through the tiers, then parked with its saga and reason; each
// time the compensation times out the saga resends it (same idempotency key),
// up to the step's budget of 5 attempts, and then goes to manual review with
// the reason recorded, never silently nowhere. The reservation stays held for
// the operator: nothing was released.
func TestCompensationFailureGoesToManualReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	release := inventoryv1.ReleaseInventoryInfo.FullName
	req := request("o-release-broken")
	req.CardToken = app.DeclinedCard
	b.script.FailTransiently("o-release-broken", release, 1000)
	id := b.start(t, req)

	b.waitState(t, id, orderv1.PlaceOrderStateCompensatingReserveInventory)
	parked := func(want int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d parked ReleaseInventory messages", want), func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_parked WHERE message_type = $1 AND saga_id = $2`, release, id).Scan(&n))
			return n == want
		})
	}
	const attempts = 5 // max_attempts of ReserveInventory in the contract
	for attempt := 1; attempt <= attempts; attempt++ {
		parked(attempt)
		require.Equal(t, 4*attempt, b.script.Deliveries("o-release-broken", release), "each attempt: the retry budget, then parked")
		b.clock.Advance(31 * time.Second) // past the compensation's timeout: resend, or give up after the last
		if attempt < attempts {
			b.wait(t, id, fmt.Sprintf("compensation attempt %d", attempt+1), func(st *orderv1.PlaceOrderSnapshot) bool { return st.Attempt == attempt+1 })
		}
	}
	var reason, class string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason, class FROM saga_parked WHERE message_type = $1 AND saga_id = $2 ORDER BY id LIMIT 1`, release, id).
		Scan(&reason, &class))
	require.Equal(t, "exhausted", class)
	require.Contains(t, reason, "scripted transient failure")

	st := b.waitState(t, id, orderv1.PlaceOrderStateManualReview)
	require.NotEmpty(t, st.ReviewReason)
	require.Contains(t, st.ReviewReason, "compensation")
	require.Equal(t, []string{"inventory:reserved", "payment:declined"}, b.ledger(t, "o-release-broken"))
}

// TestStartHandsFirstCommandToTheRelay: a saga started with Start, in the
// engine's own transaction, has its first command handed to this process's
// relay after the commit (born leased, never claimed), as the host gave its
// engines a relay; one started in the application's own transaction
// (StartTx) is claimed. Both complete.
func TestStartHandsFirstCommandToTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// setup returns once the host started its relays' goroutines: a start
	// made before a relay's Run has begun is (rightly) written unleased and
	// claimed. A first saga completes only once the relay runs.
	warm, _, err := b.placeOrder.Start(ctx, request("o-warm-up"), message.Meta{})
	require.NoError(t, err)
	b.waitState(t, warm, orderv1.PlaceOrderStateCompleted)
	handed, _, err := b.placeOrder.Start(ctx, request("o-handed"), message.Meta{})
	require.NoError(t, err)
	var claimed string
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		claimed, _, err = b.placeOrder.StartTx(ctx, tx, request("o-claimed"), message.Meta{})
		return err
	}))
	b.waitState(t, handed, orderv1.PlaceOrderStateCompleted)
	b.waitState(t, claimed, orderv1.PlaceOrderStateCompleted)

	// The first command of each: born leased to the local relay and
	// published under that lease, or not.
	bornLeased := func(sagaID string) bool {
		t.Helper()
		var leased bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT coalesce(o.lease_owner = s.published_by AND s.attempts = 1
  AND o.lease_until = o.created_at + interval '30 seconds', false)
FROM saga_outbox_state s JOIN saga_outbox o ON o.id = s.id
WHERE s.saga_id = $1 AND s.published_at IS NOT NULL ORDER BY s.id LIMIT 1`, sagaID).Scan(&leased))
		return leased
	}
	require.True(t, bornLeased(handed), "started by the engine: handed over after the commit")
	require.False(t, bornLeased(claimed), "started in the application's transaction: claimed by a relay")
	require.Positive(t, b.host.RelayStats().HandedOff)
}

// TestShutdownPublishesWhatTheLastBatchesCommit: a participant's handler is
// still running when the app is told to stop. The consumer drains (the
// handler finishes and its batch commits), and the relays run until every
// consumer has drained, so the reply that last batch committed is
// published before Stop returns rather than left to another process.
func TestShutdownPublishesWhatTheLastBatchesCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	paused, resume := b.script.Pause("o-drain", authorizePayment)
	t.Cleanup(resume) // runs before setup's stop, should the test end early
	id := b.start(t, request("o-drain"))
	select {
	case <-paused:
	case <-time.After(waitFor):
		t.Fatal("the payment command never reached its handler")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- b.stop() }()
	// Stopping: the saga's consumer has cancelled its subscription. (The
	// paused one's stays listed while it holds an unacknowledged message.)
	b.waitNoConsumers(t, "order.saga.place_order")
	resume()
	require.NoError(t, <-stopped)

	ctx := context.Background()
	var unpublished int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL`).Scan(&unpublished))
	require.Zero(t, unpublished, "every row the draining consumers committed was published before Stop returned")
	var replies int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE saga_id = $1 AND message_type = $2`,
		id, paymentv1.PaymentAuthorizedInfo.FullName).Scan(&replies))
	require.Equal(t, 1, replies, "the paused handler's reply was committed")
	st, err := b.placeOrder.GetByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, orderv1.PlaceOrderStateAuthorizePayment, st.State, "nothing consumed the reply: the host had stopped")
}

// TestCompensationOvertakingItsCommand: the reservation of an order is held
// in its handler, before any effect, while its step times out; the saga
// compensates, and the release runs first, with nothing to release. When
// the held reservation goes on, the host's participant wiring has recorded
// it as compensated: it takes no stock and sends no reply, and the saga
// ends FAILED with the stock untouched. The inventory's code has no
// tombstone of its own.
func TestCompensationOvertakingItsCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	paused, resume := b.script.Pause("o-overtaken", reserveInventory)
	t.Cleanup(resume)
	id := b.start(t, request("o-overtaken"))
	select {
	case <-paused:
	case <-time.After(waitFor):
		t.Fatal("the reservation never reached its handler")
	}
	b.clock.Advance(31 * time.Second) // past the reservation's 30 s timeout: compensate
	b.waitState(t, id, orderv1.PlaceOrderStateFailed)
	require.Equal(t, []string{"inventory:released_nothing"}, b.ledger(t, "o-overtaken"))
	resume()

	var reserveID string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT message_id FROM saga_outbox WHERE saga_id = $1 AND message_type = $2`,
		id, reserveInventory).Scan(&reserveID))
	eventually(t, "the held reservation handled", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_inbox WHERE consumer = 'inventory.commands' AND message_id = $1`,
			reserveID).Scan(&n))
		return n == 1
	})
	require.Equal(t, []string{"inventory:released_nothing"}, b.ledger(t, "o-overtaken"), "the overtaken reservation had no effect")
	var replies, held int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE causation_id = $1`, reserveID).Scan(&replies))
	require.Zero(t, replies, "and sent no reply")
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT coalesce(sum(available), 0) FROM inventory_stock WHERE product_id IN ('widget', 'gadget')`).Scan(&held))
	require.Equal(t, 2000, held, "no stock held for an order nobody will release again")
}

// TestResentCommandAppliedOnce: the payment service's code never mentions
// idempotency. A completed order's AuthorizePayment is sent again as a new
// message (new message id, same idempotency key), as a saga's retry or an
// upstream duplicate would be: the participant registered the default way
// answers it with the first reply (the same authorization) and authorizes
// nothing twice.
func TestResentCommandAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.start(t, request("o-resent"))
	b.waitState(t, id, orderv1.PlaceOrderStateCompleted)

	var body []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT body FROM saga_outbox WHERE saga_id = $1 AND message_type = $2`,
		id, authorizePayment).Scan(&body))
	cmd := new(paymentv1.AuthorizePayment)
	require.NoError(t, proto.Unmarshal(body, cmd))
	var resentID string
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		resentID, err = paymentv1.PublishAuthorizePayment(ctx, tx, cmd, message.Meta{SagaID: id, CorrelationID: id,
			SagaType: orderv1.PlaceOrderDefinition().Name})
		return err
	}))

	replies := func(causation string) []string {
		rows, err := b.pool.Query(ctx, `SELECT body FROM saga_outbox WHERE causation_id = $1 AND message_type = $2`,
			causation, paymentv1.PaymentAuthorizedInfo.FullName)
		require.NoError(t, err)
		bodies, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		require.NoError(t, err)
		var auths []string
		for _, body := range bodies {
			r := new(paymentv1.PaymentAuthorized)
			require.NoError(t, proto.Unmarshal(body, r))
			auths = append(auths, r.GetAuthorizationId())
		}
		return auths
	}
	eventually(t, "the resent command answered", func() bool { return len(replies(resentID)) == 1 })
	var firstID string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT message_id FROM saga_outbox WHERE saga_id = $1 AND message_type = $2 AND message_id <> $3`,
		id, authorizePayment, resentID).Scan(&firstID))
	require.Equal(t, replies(firstID), replies(resentID), "the resend gets the first reply: the same authorization")
	require.Equal(t, []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}, b.ledger(t, "o-resent"),
		"authorized once")
}
