package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

// Tokens of the test server.
const (
	repairToken = "repair-token-0123456789abcdef"
	readToken   = "read-token-0123456789abcdef"
	// cardToken is a sensitive value: it must never appear in an answer.
	cardToken = "tok_4111111111111111_secret"
	street    = "221B Baker Street"
)

var tokens = admin.Tokens{
	repairToken: {Name: "alice", Role: admin.RoleRepair},
	readToken:   {Name: "viewer", Role: admin.RoleRead},
}

// decider is the Place Order business logic for tests. When broken is set,
// folding InventoryReserved fails permanently (a bug an operator fixes, after
// which the parked reply is replayed).
type decider struct {
	orderv1.PlaceOrderNoopFolds
	broken *atomic.Bool
}

func (decider) Start(_ context.Context, r *orderv1.PlaceOrderRequest) (*orderv1.PlaceOrderData, error) {
	return &orderv1.PlaceOrderData{OrderId: r.GetOrderId(), CustomerId: r.GetCustomerId(), Lines: r.GetLines(),
		Amount: r.GetAmount(), ShippingAddress: r.GetShippingAddress(), CardToken: r.GetCardToken()}, nil
}

func (decider) BuildReserveInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReserveInventory, error) {
	return &inventoryv1.ReserveInventory{OrderId: d.GetOrderId(), Lines: d.GetLines()}, nil
}

func (decider) BuildReleaseInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReleaseInventory, error) {
	return &inventoryv1.ReleaseInventory{OrderId: d.GetOrderId()}, nil
}

func (decider) BuildAuthorizePayment(_ context.Context, d *orderv1.PlaceOrderData) (*paymentv1.AuthorizePayment, error) {
	return &paymentv1.AuthorizePayment{OrderId: d.GetOrderId(), CustomerId: d.GetCustomerId(), Amount: d.GetAmount(), CardToken: d.GetCardToken()}, nil
}

func (decider) BuildScheduleShipping(_ context.Context, d *orderv1.PlaceOrderData) (*shippingv1.ScheduleShipping, error) {
	return &shippingv1.ScheduleShipping{OrderId: d.GetOrderId(), Address: d.GetShippingAddress()}, nil
}

func (decider) BuildApproveOrder(_ context.Context, d *orderv1.PlaceOrderData) (*orderv1.ApproveOrder, error) {
	return &orderv1.ApproveOrder{OrderId: d.GetOrderId()}, nil
}

func (d decider) OnInventoryReserved(_ context.Context, data *orderv1.PlaceOrderData, _ *inventoryv1.InventoryReserved) error {
	if d.broken != nil && d.broken.Load() {
		return retry.Permanent(errors.New("inventory reservation rejected by a bug in OnInventoryReserved"))
	}
	data.FailureReason = ""
	return nil
}

// clock is a test clock shared by the engine and the admin server.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type bundle struct {
	pool   *pgxpool.Pool
	engine *saga.Engine
	clock  *clock
	broken *atomic.Bool
	server *admin.Server
	http   *httptest.Server
	logs   *testenv.LogBuffer // the server's log, as JSON
}

// setup gives a test its own schema with the Place Order tables, an engine
// on a test clock and an admin server over both.
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	clk := &clock{now: time.Now().UTC().Truncate(time.Second)}
	broken := &atomic.Bool{}
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool, Now: clk.Now, Logger: slog.New(slog.DiscardHandler)}, decider{broken: broken})
	require.NoError(t, err)
	logs := &testenv.LogBuffer{}
	// Tests try many wrong tokens on purpose; the sign-in limit has its
	// own test.
	srv, err := admin.New(admin.Config{Pool: pool, Sagas: []*saga.Engine{po.Engine()}, Tokens: tokens,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), Now: clk.Now, StuckGrace: -1, MaxFailedSignIns: -1})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &bundle{pool: pool, engine: po.Engine(), clock: clk, broken: broken, server: srv, http: hs, logs: logs}
}

// start starts a Place Order saga for order and returns its id.
func (b *bundle) start(t *testing.T, order string) string {
	t.Helper()
	id, created, err := b.engine.Start(context.Background(), &orderv1.PlaceOrderRequest{
		OrderId: order, CustomerId: "cust-1",
		Lines:           []*commonv1.OrderLine{{ProductId: "sku-1", Quantity: 2}},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 4200},
		ShippingAddress: &commonv1.Address{Name: "S. Holmes", Street: street, City: "London"},
		CardToken:       cardToken,
	}, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

func (b *bundle) status(t *testing.T, id string) saga.Status {
	t.Helper()
	st, err := b.engine.Status(context.Background(), id)
	require.NoError(t, err)
	return st
}

// replyEnvelope is the envelope a participant would publish for m in answer
// to the saga's pending command.
func (b *bundle) replyEnvelope(t *testing.T, id string, m message.Message) message.Envelope {
	t.Helper()
	st := b.status(t, id)
	env, err := message.New(m, message.Meta{SagaID: id, SagaType: st.Type, CausationID: st.PendingMessageID})
	require.NoError(t, err)
	return env
}

// deliver applies env to its saga as the consumer would, in a transaction.
func (b *bundle) deliver(t *testing.T, env message.Envelope, m message.Message) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.engine.Handle(context.Background(), tx, deliveryOf(env, m))
	})
}

func deliveryOf(env message.Envelope, m message.Message) *consumer.Delivery {
	return &consumer.Delivery{Envelope: env, Message: m, Queue: "order.saga.place_order", Attempt: 1}
}

// reply answers the saga's pending command with m.
func (b *bundle) reply(t *testing.T, id string, m message.Message) {
	t.Helper()
	require.NoError(t, b.deliver(t, b.replyEnvelope(t, id, m), m))
}

// markPublished records the outbox row of messageID as a relay does once
// the broker confirmed it: no longer pending, sent by relay "test".
func (b *bundle) markPublished(t *testing.T, messageID string) {
	t.Helper()
	tag, err := b.pool.Exec(t.Context(), `WITH done AS (
  DELETE FROM saga_outbox_pending WHERE id = (SELECT id FROM saga_outbox WHERE message_id = $1) RETURNING id, attempts
)
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) SELECT id, now(), attempts + 1, 'test' FROM done`, messageID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "outbox row %s is not pending", messageID)
}

// park records env as the consumer of queue would after a permanent
// failure, and returns the saga_parked id.
func (b *bundle) park(t *testing.T, env message.Envelope, queue, reason string) int64 {
	t.Helper()
	pub := env.Publishing()
	headers, err := json.Marshal(pub.Headers)
	require.NoError(t, err)
	// A message that names no saga keeps its correlation field, as the
	// consumer parks it.
	var key string
	if env.SagaID == "" {
		if info, ok := b.engine.Registry().Lookup(env.MessageType); ok {
			m := info.New()
			if proto.Unmarshal(env.Body, m) == nil {
				key = m.CorrelationKey()
			}
		}
	}
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `INSERT INTO saga_parked (message_id, queue, message_type,
	saga_id, saga_type, correlation_id, class, reason, attempts, exchange, routing_key, headers, body, first_failure_at, correlation_key)
VALUES ($1, $2, $3, $4, $5, $6, 'permanent', $7, 1, $8, $9, $10, $11, $12, $13) RETURNING id`,
		env.MessageID, queue, env.MessageType, env.SagaID, env.SagaType, env.CorrelationID, reason,
		env.Exchange, env.RoutingKey, headers, env.Body, b.clock.Now(), key).Scan(&id))
	return id
}

// manualReview drives a new saga into MANUAL_REVIEW: inventory reserved,
// then the payment step times out MaxAttempts (3) times.
func (b *bundle) manualReview(t *testing.T, order string) string {
	t.Helper()
	id := b.start(t, order)
	b.reply(t, id, &inventoryv1.InventoryReserved{OrderId: order})
	for range 3 {
		b.clock.Advance(2 * time.Minute)
		_, err := b.engine.FireTimeouts(context.Background(), 100)
		require.NoError(t, err)
	}
	require.Equal(t, "MANUAL_REVIEW", b.status(t, id).State)
	return id
}

// call makes an API request and returns the status and body.
func (b *bundle) call(t *testing.T, token, method, path string, body any) (int, []byte) {
	t.Helper()
	return b.callCtx(t.Context(), t, token, method, path, body)
}

// callCtx is call bounded by ctx.
func (b *bundle) callCtx(ctx context.Context, t *testing.T, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.http.URL+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := b.http.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, raw
}

// get calls path with the repair token, requires 200 and decodes into out.
func getJSON[T any](t *testing.T, b *bundle, path string) T {
	t.Helper()
	code, raw := b.call(t, repairToken, http.MethodGet, path, nil)
	require.Equal(t, http.StatusOK, code, string(raw))
	var out T
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return out
}

// postJSON posts body with the repair token, requires want and decodes.
func postJSON[T any](t *testing.T, b *bundle, path string, body any, want int) T {
	t.Helper()
	code, raw := b.call(t, repairToken, http.MethodPost, path, body)
	require.Equal(t, want, code, string(raw))
	var out T
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return out
}

// apiError decodes an error answer.
func apiError(t *testing.T, raw []byte) admin.Error {
	t.Helper()
	var e admin.Error
	require.NoError(t, json.Unmarshal(raw, &e), string(raw))
	require.NotEmpty(t, e.Code, string(raw))
	return e
}

// audit returns the saga's audit rows as "trigger|operator|note".
func (b *bundle) audit(t *testing.T, id string) []saga.AuditRecord {
	t.Helper()
	h, err := b.engine.History(context.Background(), id)
	require.NoError(t, err)
	return h
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
