// Package wm is the Place Order saga built the way a competent Watermill user
// would build it, to compare completed sagas per second with the saga runtime
// in the same run.
//
// # Shape
//
// The same four steps as the runtime's Place Order example (reserve
// inventory, authorize payment, schedule shipping, approve order), the same
// protobuf messages, and participants doing the same SQL effects on the same
// tables (app.Migrations: stock, reservations, authorizations, shipments,
// approvals, the shop_ledger journal). Eight router handlers, one per queue:
// four participants consume commands, four orchestrator handlers consume the
// replies. Every handler runs one PostgreSQL transaction that
//
//  1. claims the message in an inbox table (wm_processed, primary key
//     handler + message UUID; a duplicate commits nothing else and is acked),
//  2. does its work: the participant's effect, or the orchestrator's state
//     change on the saga row (SELECT ... FOR UPDATE, then UPDATE),
//  3. writes the next message through watermill-sql's publisher on that
//     transaction, wrapped by the forwarder's publisher: the outbox.
//
// Five forwarders (watermill's components/forwarder: a SQL subscriber on the
// outbox topic, an AMQP publisher with publisher confirms), one per service
// that sends messages (order saga, inventory, payment, shipping, approval),
// move the outbox rows to RabbitMQ. Confirms are on: without them the
// forwarder acknowledges outbox rows the broker may have lost, which would
// defeat the outbox.
//
// # Tuning (stated, not hidden)
//
//   - AMQP: durable queues of the configured type (quorum by default, like
//     the runtime's), persistent messages, prefetch 64 per handler, one
//     consuming connection, one publishing connection with a pool of 8
//     confirm-mode channels (without a pool, watermill-amqp opens a channel
//     per publish).
//   - SQL subscriber: batch 100 rows per query, poll interval 10 ms, the
//     default PostgreSQL schema and offsets adapters.
//   - Router: Recoverer and Retry (3 retries, 10 ms initial interval)
//     middleware.
//
// # What it leaves out
//
// Timeouts, compensation and manual review: the benchmark runs only orders
// that succeed, so those paths would cost nothing here. Failure replies set
// the saga FAILED. The saga table records when each step's reply was applied
// (clock_timestamp()), for step latencies, in the same UPDATE.
package wm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/bench/internal/workload"
	"github.com/protosaga/saga/examples/placeorder/app"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/schema"
)

// AMQP queues (watermill topics) of commands and replies.
const (
	topicReserve    = "wm.inventory.reserve"
	topicAuthorize  = "wm.payment.authorize"
	topicShip       = "wm.shipping.schedule"
	topicApprove    = "wm.order.approve"
	topicInventory  = "wm.saga.inventory-replies"
	topicPayment    = "wm.saga.payment-replies"
	topicShipping   = "wm.saga.shipping-replies"
	topicApproval   = "wm.saga.approval-replies"
	metaType        = "type"
	metaOrderID     = "order_id"
	forwarderPrefix = "wm_outbox_"
)

// Outbox topics (SQL tables), one per sending service.
var outboxes = []string{"order", "inventory", "payment", "shipping", "approval"}

// Saga states.
const (
	stateReserving   = "RESERVE_INVENTORY"
	stateAuthorizing = "AUTHORIZE_PAYMENT"
	stateShipping    = "SCHEDULE_SHIPPING"
	stateApproving   = "APPROVE_ORDER"
	// StateCompleted is the state of a saga that finished every step.
	StateCompleted = "COMPLETED"
	stateFailed    = "FAILED"
)

const tables = `
CREATE TABLE wm_saga (
  order_id      text PRIMARY KEY,
  state         text NOT NULL,
  version       bigint NOT NULL DEFAULT 1,
  data          bytea NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  reserved_at   timestamptz,
  authorized_at timestamptz,
  shipped_at    timestamptz,
  approved_at   timestamptz
);
CREATE INDEX wm_saga_state ON wm_saga (state);
CREATE TABLE wm_processed (
  handler    text NOT NULL,
  message_id text NOT NULL,
  at         timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (handler, message_id)
);`

// Config configures the Watermill saga.
type Config struct {
	Pool      *pgxpool.Pool // on a fresh schema
	AMQPURL   string        // on a fresh vhost
	QueueType string        // "quorum" (default) or "classic"
	Logger    *slog.Logger  // handler errors; default slog.Default()
}

// Saga is the running Watermill saga.
type Saga struct {
	cfg      Config
	logger   watermill.LoggerAdapter
	sub      *wamqp.Subscriber
	pub      *wamqp.Publisher
	router   *message.Router
	fwds     []*forwarder.Forwarder
	sqlSubs  []*wsql.Subscriber
	errCount atomic.Int64
}

// New creates the tables (app.Migrations for the participants' tables, the
// saga and inbox tables, watermill-sql's outbox tables), declares the queues
// and builds the router and forwarders. Sagas may be started once New
// returns; nothing moves until Run.
func New(ctx context.Context, cfg Config) (*Saga, error) {
	if cfg.QueueType == "" {
		cfg.QueueType = "quorum"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Saga{cfg: cfg, logger: watermill.NopLogger{}}
	if err := schema.Migrate(ctx, cfg.Pool, app.Migrations()); err != nil {
		return nil, fmt.Errorf("watermill saga: migrate shop tables: %w", err)
	}
	if _, err := cfg.Pool.Exec(ctx, tables); err != nil {
		return nil, fmt.Errorf("watermill saga: create saga tables: %w", err)
	}
	if err := s.build(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Saga) amqpConfig() wamqp.Config {
	c := wamqp.NewDurableQueueConfig(s.cfg.AMQPURL)
	c.Queue.Arguments = amqp.Table{"x-queue-type": s.cfg.QueueType}
	c.Consume.Qos.PrefetchCount = 64
	c.Publish.ConfirmDelivery = true
	c.Publish.ChannelPoolSize = 8
	return c
}

func (s *Saga) build() error {
	var err error
	if s.sub, err = wamqp.NewSubscriber(s.amqpConfig(), s.logger); err != nil {
		return fmt.Errorf("watermill saga: amqp subscriber: %w", err)
	}
	if s.pub, err = wamqp.NewPublisher(s.amqpConfig(), s.logger); err != nil {
		return fmt.Errorf("watermill saga: amqp publisher: %w", err)
	}
	for _, t := range []string{topicReserve, topicAuthorize, topicShip, topicApprove, topicInventory, topicPayment, topicShipping, topicApproval} {
		if err := s.sub.SubscribeInitialize(t); err != nil {
			return fmt.Errorf("watermill saga: declare queue %s: %w", t, err)
		}
	}
	if s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, s.logger); err != nil {
		return fmt.Errorf("watermill saga: router: %w", err)
	}
	s.router.AddMiddleware(
		middleware.Recoverer,
		middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond, Logger: s.logger}.Middleware,
	)
	handlers := []struct {
		name, topic string
		fn          func(ctx context.Context, tx pgx.Tx, msg *message.Message) error
	}{
		{"inventory.reserve", topicReserve, s.reserve},
		{"payment.authorize", topicAuthorize, s.authorize},
		{"shipping.schedule", topicShip, s.schedule},
		{"order.approve", topicApprove, s.approve},
		{"saga.on-inventory", topicInventory, s.onInventory},
		{"saga.on-payment", topicPayment, s.onPayment},
		{"saga.on-shipping", topicShipping, s.onShipping},
		{"saga.on-approval", topicApproval, s.onApproval},
	}
	for _, h := range handlers {
		s.router.AddConsumerHandler(h.name, h.topic, s.sub, s.inTx(h.name, h.fn))
	}
	for _, name := range outboxes {
		topic := forwarderPrefix + name
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(s.cfg.Pool), wsql.SubscriberConfig{
			ConsumerGroup:    "forwarder",
			PollInterval:     10 * time.Millisecond,
			SchemaAdapter:    wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 100},
			OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
			InitializeSchema: true,
		}, s.logger)
		if err != nil {
			return fmt.Errorf("watermill saga: outbox subscriber %s: %w", name, err)
		}
		s.sqlSubs = append(s.sqlSubs, sub)
		if err := sub.SubscribeInitialize(topic); err != nil {
			return fmt.Errorf("watermill saga: outbox table %s: %w", name, err)
		}
		fwd, err := forwarder.NewForwarder(sub, s.pub, s.logger, forwarder.Config{ForwarderTopic: topic})
		if err != nil {
			return fmt.Errorf("watermill saga: forwarder %s: %w", name, err)
		}
		s.fwds = append(s.fwds, fwd)
	}
	return nil
}

// Run runs the router and the forwarders until ctx is cancelled.
func (s *Saga) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(s.fwds)+1)
	for i, f := range s.fwds {
		wg.Go(func() { errs[i] = f.Run(ctx) })
	}
	wg.Go(func() { errs[len(s.fwds)] = s.router.Run(ctx) })
	wg.Wait()
	return errors.Join(errs...)
}

// Errors is how many handler attempts failed (each is retried).
func (s *Saga) Errors() int64 { return s.errCount.Load() }

// Close closes the connections.
func (s *Saga) Close() {
	for _, sub := range s.sqlSubs {
		_ = sub.Close()
	}
	if s.sub != nil {
		_ = s.sub.Close()
	}
	if s.pub != nil {
		_ = s.pub.Close()
	}
}

// inTx runs fn in one transaction after claiming the message in the inbox;
// a message already claimed by this handler is acked without running fn.
func (s *Saga) inTx(handler string, fn func(context.Context, pgx.Tx, *message.Message) error) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO wm_processed (handler, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
				handler, msg.UUID)
			if err != nil {
				return fmt.Errorf("%s: claim message %s: %w", handler, msg.UUID, err)
			}
			if tag.RowsAffected() == 0 {
				return nil // a duplicate delivery
			}
			return fn(ctx, tx, msg)
		})
		// An attempt the router's shutdown cut short (the benchmark's time
		// limit ended the run) is redelivered later, not a failure.
		if err != nil && ctx.Err() == nil {
			if s.errCount.Add(1) <= 5 {
				s.cfg.Logger.Error("watermill handler failed", "handler", handler, "err", err)
			}
		}
		return err
	}
}

// send writes m to the outbox of service in tx, bound for the AMQP queue
// topic.
func send(tx pgx.Tx, service, topic, orderID string, m proto.Message) error {
	body, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal %T for order %s: %w", m, orderID, err)
	}
	sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("outbox publisher: %w", err)
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderPrefix + service})
	msg := message.NewMessage(watermill.NewUUID(), body)
	msg.Metadata.Set(metaType, string(proto.MessageName(m)))
	msg.Metadata.Set(metaOrderID, orderID)
	if err := pub.Publish(topic, msg); err != nil {
		return fmt.Errorf("outbox %s: publish %T for order %s: %w", service, m, orderID, err)
	}
	return nil
}

// StartTx starts the saga of req in tx: the saga row and the first command.
func StartTx(ctx context.Context, tx pgx.Tx, req *orderv1.PlaceOrderRequest) error {
	data := &orderv1.PlaceOrderData{
		OrderId: req.GetOrderId(), CustomerId: req.GetCustomerId(), Lines: req.GetLines(),
		Amount: req.GetAmount(), ShippingAddress: req.GetShippingAddress(), CardToken: req.GetCardToken(),
	}
	b, err := proto.Marshal(data)
	if err != nil {
		return fmt.Errorf("marshal saga data of order %s: %w", req.GetOrderId(), err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO wm_saga (order_id, state, data) VALUES ($1, $2, $3)`,
		req.GetOrderId(), stateReserving, b); err != nil {
		return fmt.Errorf("insert saga of order %s: %w", req.GetOrderId(), err)
	}
	return send(tx, "order", topicReserve, req.GetOrderId(),
		&inventoryv1.ReserveInventory{OrderId: data.GetOrderId(), Lines: data.GetLines()})
}

// Start starts one saga in its own transaction.
func (s *Saga) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	return pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error { return StartTx(ctx, tx, req) })
}

func unmarshal(msg *message.Message, m proto.Message) error {
	if err := proto.Unmarshal(msg.Payload, m); err != nil {
		return fmt.Errorf("decode %T from message %s: %w", m, msg.UUID, err)
	}
	return nil
}

func journal(ctx context.Context, tx pgx.Tx, orderID, service, effect, detail string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO shop_ledger (order_id, service, effect, detail) VALUES ($1, $2, $3, $4)`,
		orderID, service, effect, detail); err != nil {
		return fmt.Errorf("%s: journal %s of order %s: %w", service, effect, orderID, err)
	}
	return nil
}

// reserve is the inventory participant: lock the stock rows in product
// order, check and take the stock, record the reservation, journal it, reply.
func (s *Saga) reserve(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var cmd inventoryv1.ReserveInventory
	if err := unmarshal(msg, &cmd); err != nil {
		return err
	}
	orderID := cmd.GetOrderId()
	want := map[string]int32{}
	for _, l := range cmd.GetLines() {
		want[l.GetProductId()] += l.GetQuantity()
	}
	products := make([]string, 0, len(want))
	for p := range want {
		products = append(products, p)
	}
	sort.Strings(products)
	quantities := make([]int32, len(products))
	for i, p := range products {
		quantities[i] = want[p]
	}
	rows, err := tx.Query(ctx, `SELECT product_id, available FROM inventory_stock WHERE product_id = ANY($1) ORDER BY product_id FOR UPDATE`, products)
	if err != nil {
		return fmt.Errorf("inventory: lock stock of order %s: %w", orderID, err)
	}
	available := map[string]int32{}
	for rows.Next() {
		var p string
		var n int32
		if err := rows.Scan(&p, &n); err != nil {
			rows.Close()
			return fmt.Errorf("inventory: read stock of order %s: %w", orderID, err)
		}
		available[p] = n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inventory: read stock of order %s: %w", orderID, err)
	}
	for i, p := range products {
		if available[p] < quantities[i] {
			if err := journal(ctx, tx, orderID, "inventory", "reservation_refused", p); err != nil {
				return err
			}
			return send(tx, "inventory", topicInventory, orderID,
				&inventoryv1.InventoryReservationFailed{OrderId: orderID, Reason: "out of stock: " + p})
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE inventory_stock s SET available = s.available - x.q
FROM unnest($1::text[], $2::int[]) AS x(p, q) WHERE s.product_id = x.p`, products, quantities); err != nil {
		return fmt.Errorf("inventory: take stock of order %s: %w", orderID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inventory_reservations (order_id, product_id, quantity)
SELECT $1, p, q FROM unnest($2::text[], $3::int[]) AS x(p, q)`, orderID, products, quantities); err != nil {
		return fmt.Errorf("inventory: record reservation of order %s: %w", orderID, err)
	}
	if err := journal(ctx, tx, orderID, "inventory", "reserved", fmt.Sprint(products, quantities)); err != nil {
		return err
	}
	return send(tx, "inventory", topicInventory, orderID, &inventoryv1.InventoryReserved{OrderId: orderID})
}

// authorize is the payment participant.
func (s *Saga) authorize(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var cmd paymentv1.AuthorizePayment
	if err := unmarshal(msg, &cmd); err != nil {
		return err
	}
	orderID := cmd.GetOrderId()
	authID := "auth_" + watermill.NewUUID()
	if _, err := tx.Exec(ctx, `INSERT INTO payment_authorizations (order_id, authorization_id, currency, minor_units)
VALUES ($1, $2, $3, $4)`, orderID, authID, cmd.GetAmount().GetCurrency(), cmd.GetAmount().GetMinorUnits()); err != nil {
		return fmt.Errorf("payment: authorize order %s: %w", orderID, err)
	}
	if err := journal(ctx, tx, orderID, "payment", "authorized", fmt.Sprint(cmd.GetAmount().GetMinorUnits())); err != nil {
		return err
	}
	return send(tx, "payment", topicPayment, orderID, &paymentv1.PaymentAuthorized{OrderId: orderID, AuthorizationId: authID})
}

// schedule is the shipping participant.
func (s *Saga) schedule(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var cmd shippingv1.ScheduleShipping
	if err := unmarshal(msg, &cmd); err != nil {
		return err
	}
	orderID := cmd.GetOrderId()
	tracking := "trk_" + watermill.NewUUID()
	if _, err := tx.Exec(ctx, `INSERT INTO shipping_shipments (order_id, tracking_id) VALUES ($1, $2)`, orderID, tracking); err != nil {
		return fmt.Errorf("shipping: book order %s: %w", orderID, err)
	}
	if err := journal(ctx, tx, orderID, "shipping", "booked", cmd.GetAddress().GetCountry()); err != nil {
		return err
	}
	return send(tx, "shipping", topicShipping, orderID, &shippingv1.ShippingScheduled{OrderId: orderID, TrackingId: tracking})
}

// approve is the order service's approval participant.
func (s *Saga) approve(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var cmd orderv1.ApproveOrder
	if err := unmarshal(msg, &cmd); err != nil {
		return err
	}
	orderID := cmd.GetOrderId()
	if _, err := tx.Exec(ctx, `INSERT INTO order_approvals (order_id) VALUES ($1)`, orderID); err != nil {
		return fmt.Errorf("order: approve order %s: %w", orderID, err)
	}
	if err := journal(ctx, tx, orderID, "order", "approved", ""); err != nil {
		return err
	}
	return send(tx, "approval", topicApproval, orderID, &orderv1.OrderApproved{OrderId: orderID})
}

// transition locks the saga row, checks it waits in state from, moves it to
// to (stamping column at), and returns the saga data for the next command.
// ok is false when the saga is elsewhere (a late or duplicate reply): the
// message is acked and nothing changes.
func transition(ctx context.Context, tx pgx.Tx, orderID, from, to, column string) (data *orderv1.PlaceOrderData, ok bool, err error) {
	var state string
	var b []byte
	if err := tx.QueryRow(ctx, `SELECT state, data FROM wm_saga WHERE order_id = $1 FOR UPDATE`, orderID).Scan(&state, &b); err != nil {
		return nil, false, fmt.Errorf("saga: lock order %s: %w", orderID, err)
	}
	if state != from {
		return nil, false, nil
	}
	data = &orderv1.PlaceOrderData{}
	if err := proto.Unmarshal(b, data); err != nil {
		return nil, false, fmt.Errorf("saga: decode data of order %s: %w", orderID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE wm_saga SET state = $2, version = version + 1, updated_at = clock_timestamp(), `+
		column+` = clock_timestamp() WHERE order_id = $1`, orderID, to); err != nil {
		return nil, false, fmt.Errorf("saga: update order %s: %w", orderID, err)
	}
	return data, true, nil
}

func (s *Saga) onInventory(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	orderID := msg.Metadata.Get(metaOrderID)
	if msg.Metadata.Get(metaType) != string(proto.MessageName(&inventoryv1.InventoryReserved{})) {
		_, _, err := transition(ctx, tx, orderID, stateReserving, stateFailed, "reserved_at")
		return err
	}
	d, ok, err := transition(ctx, tx, orderID, stateReserving, stateAuthorizing, "reserved_at")
	if err != nil || !ok {
		return err
	}
	return send(tx, "order", topicAuthorize, orderID, &paymentv1.AuthorizePayment{
		OrderId: orderID, CustomerId: d.GetCustomerId(), Amount: d.GetAmount(), CardToken: d.GetCardToken()})
}

func (s *Saga) onPayment(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	orderID := msg.Metadata.Get(metaOrderID)
	if msg.Metadata.Get(metaType) != string(proto.MessageName(&paymentv1.PaymentAuthorized{})) {
		_, _, err := transition(ctx, tx, orderID, stateAuthorizing, stateFailed, "authorized_at")
		return err
	}
	d, ok, err := transition(ctx, tx, orderID, stateAuthorizing, stateShipping, "authorized_at")
	if err != nil || !ok {
		return err
	}
	return send(tx, "order", topicShip, orderID, &shippingv1.ScheduleShipping{OrderId: orderID, Address: d.GetShippingAddress()})
}

func (s *Saga) onShipping(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	orderID := msg.Metadata.Get(metaOrderID)
	_, ok, err := transition(ctx, tx, orderID, stateShipping, stateApproving, "shipped_at")
	if err != nil || !ok {
		return err
	}
	return send(tx, "order", topicApprove, orderID, &orderv1.ApproveOrder{OrderId: orderID})
}

func (s *Saga) onApproval(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	_, _, err := transition(ctx, tx, msg.Metadata.Get(metaOrderID), stateApproving, StateCompleted, "approved_at")
	return err
}

// Restock gives every workload product its starting stock.
func Restock(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `INSERT INTO inventory_stock (product_id, available)
SELECT 'p-' || lpad(i::text, 4, '0'), $2 FROM generate_series(0, $1::int - 1) AS i
ON CONFLICT (product_id) DO UPDATE SET available = EXCLUDED.available`, workload.Products, workload.Stock); err != nil {
		return fmt.Errorf("restock: %w", err)
	}
	return nil
}
