package saga_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/apipb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
)

// testMsg is the runtime's shared test message (sagatest.Message): the
// value is the order id, which is the saga's business key.
type testMsg = *sagatest.Message

const pkg = "test.order.v1."

// Message types of the test contract.
var (
	msgPlaceOrder         = newInfo("PlaceOrder", message.KindCommand)
	msgReserveInventory   = newInfo("ReserveInventory", message.KindCommand)
	msgInventoryReserved  = newInfo("InventoryReserved", message.KindReply)
	msgInventoryFailed    = newInfo("InventoryFailed", message.KindReply)
	msgReleaseInventory   = newInfo("ReleaseInventory", message.KindCommand)
	msgInventoryReleased  = newInfo("InventoryReleased", message.KindReply)
	msgAuthorizePayment   = newInfo("AuthorizePayment", message.KindCommand)
	msgPaymentAuthorized  = newInfo("PaymentAuthorized", message.KindReply)
	msgPaymentDeclined    = newInfo("PaymentDeclined", message.KindReply)
	msgScheduleShipping   = newInfo("ScheduleShipping", message.KindCommand)
	msgShippingScheduled  = newInfo("ShippingScheduled", message.KindReply)
	msgShippingFailed     = newInfo("ShippingFailed", message.KindReply)
	msgUnrelatedEvent     = newInfo("SomethingElse", message.KindEvent)
	msgPaymentApproved    = newInfo("PaymentApproved", message.KindEvent)
	msgNotifyCustomer     = newInfo("NotifyCustomer", message.KindCommand) // a step a later release adds
	msgCustomerNotified   = newInfo("CustomerNotified", message.KindReply)
	msgCancelOrder        = newCancelInfo()
	msgChildCompleted     = newInfo("OrderCompleted", message.KindReply) // a child's outcome replies
	msgChildFailed        = newInfo("OrderFailed", message.KindReply)
	msgChildCancelled     = newInfo("OrderCancelled", message.KindReply)
	msgChildInReview      = newInfo("OrderInReview", message.KindReply)
	allInfos              = []*message.Info{msgChildCompleted, msgChildFailed, msgChildCancelled, msgChildInReview, msgPlaceOrder, msgReserveInventory, msgInventoryReserved, msgInventoryFailed, msgReleaseInventory, msgInventoryReleased, msgAuthorizePayment, msgPaymentAuthorized, msgPaymentDeclined, msgScheduleShipping, msgShippingScheduled, msgShippingFailed, msgUnrelatedEvent, msgPaymentApproved, msgNotifyCustomer, msgCustomerNotified, msgCancelOrder, msgReserveCredit, msgCreditReserved, msgCreditRefused, msgReleaseCredit, msgCreditReleased}
	testRegistry, errReg  = message.NewRegistry(allInfos...)
	stepTimeout           = 10 * time.Second
	sagaDeadline          = time.Hour
	baseTime              = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	sagaTypeName          = pkg + "PlaceOrder"
	sagaDataMessage       = "google.protobuf.Struct"
	defaultLatePolicy     = sagadef.LateIgnore
	defaultReserveTimeout = sagadef.TimeoutCompensate
)

func newInfo(name string, kind message.Kind) *message.Info { return sagatest.NewType(pkg+name, kind) }

// cancelMsg is the test contract's business cancel message, over a
// well-known type with three strings: name is the order id (its
// correlation key), request_type_url who asks, response_type_url why.
type cancelMsg struct {
	*apipb.Method
}

func (cancelMsg) SagaMessageInfo() *message.Info { return msgCancelOrder }
func (m cancelMsg) IdempotencyKey() string       { return msgCancelOrder.FullName + ":" + m.GetName() }
func (m cancelMsg) CorrelationKey() string       { return m.GetName() }

func newCancelInfo() *message.Info {
	return &message.Info{
		FullName: pkg + "CancelOrder", Kind: message.KindCommand, Exchange: "test.commands",
		RoutingKey: "test.cancelorder", SchemaVersion: 1,
		New: func() message.Message { return cancelMsg{Method: &apipb.Method{}} },
	}
}

func cancelOrder(order, by, why string) cancelMsg {
	return cancelMsg{Method: &apipb.Method{Name: order, RequestTypeUrl: by, ResponseTypeUrl: why}}
}

func msg(in *message.Info, order string) testMsg {
	return sagatest.NewMessage(in, order)
}

// hooks implements sagadef.Hooks for the test contract. The saga data is a
// Struct holding the order id and the list of messages applied to it, so
// tests can see that a duplicate is never applied twice.
type hooks struct {
	builds *atomic.Int64 // Build calls, to see work done twice
	broken *atomic.Bool  // when set, Build fails for orders named "poison-*"
}

func (hooks) Start(_ context.Context, start message.Message) (proto.Message, string, error) {
	order := start.(testMsg).GetValue()
	switch {
	case order == "":
		return nil, "", fmt.Errorf("start: empty order id")
	// Failures whose text a client must never see (http_test.go).
	case strings.HasPrefix(order, "secret-"):
		return nil, "", fmt.Errorf("start: dial tcp 10.0.0.7:5432: password=hunter2 rejected")
	case strings.HasPrefix(order, "refused-"):
		return nil, "", retry.Permanent(fmt.Errorf("start: internal rule 17 (password=hunter2) refuses %s", order))
	case strings.HasPrefix(order, "transient-"):
		return nil, "", retry.Transient(fmt.Errorf("start: SQLSTATE 40001 password=hunter2"))
	}
	data, err := structpb.NewStruct(map[string]any{"order": order, "applied": []any{}})
	if err != nil {
		return nil, "", err
	}
	return data, order, nil
}

func (h hooks) Build(_ context.Context, command string, data proto.Message) (message.Message, error) {
	h.builds.Add(1)
	order := data.(*structpb.Struct).Fields["order"].GetStringValue()
	if h.broken.Load() && strings.HasPrefix(order, "poison-") {
		return nil, fmt.Errorf("build %s for %s: pricing service says no", command, order)
	}
	in, ok := testRegistry.Lookup(command)
	if !ok {
		return nil, fmt.Errorf("build: unknown command %s", command)
	}
	m := in.New().(testMsg)
	m.Value = data.(*structpb.Struct).Fields["order"].GetStringValue()
	return m, nil
}

func (hooks) Apply(_ context.Context, data proto.Message, m message.Message) error {
	s := data.(*structpb.Struct)
	list := s.Fields["applied"].GetListValue()
	if list == nil {
		list = &structpb.ListValue{}
	}
	list.Values = append(list.Values, structpb.NewStringValue(strings.TrimPrefix(m.SagaMessageInfo().FullName, pkg)))
	s.Fields["applied"] = structpb.NewListValue(list)
	return nil
}

// Skip implements sagadef.Skipper for definitions with conditional steps:
// it skips every conditional step of an order whose id starts with "skip-",
// and fails for one whose id starts with "skiperr-".
func (hooks) Skip(_ context.Context, step string, data proto.Message) (bool, string, error) {
	order := data.(*structpb.Struct).Fields["order"].GetStringValue()
	if strings.HasPrefix(order, "skiperr-") {
		return false, "", fmt.Errorf("inventory policy service unavailable")
	}
	if strings.HasPrefix(order, "skip-") {
		return true, "order " + order + " does not need " + step, nil
	}
	return false, "", nil
}

func applied(t *testing.T, st saga.Status) []string {
	t.Helper()
	var out []string
	for _, v := range st.Data.(*structpb.Struct).Fields["applied"].GetListValue().GetValues() {
		out = append(out, v.GetStringValue())
	}
	return out
}

// defOptions vary the test definition.
type defOptions struct {
	late           sagadef.LatePolicy
	reserveTimeout sagadef.TimeoutAction
	reserveMax     int
	shippingMax    int
	deadline       time.Duration
	// shippingFails gives ScheduleShipping a business failure reply
	// (ShippingFailed), which sends the saga to manual review.
	shippingFails bool
	// externalPayment makes AuthorizePayment an external step: the saga
	// sends nothing and waits for the PaymentApproved event.
	externalPayment bool
	// cancel declares CancelOrder the saga's business cancel message.
	cancel bool
	// externalCheck adds, between ReserveInventory and AuthorizePayment,
	// the check step ApproveOrder: external, completed by the
	// PaymentApproved event, compensating on timeout.
	externalCheck bool
	// conditionalReserve makes ReserveInventory conditional; the test
	// hooks skip it for orders whose id starts with "skip-".
	conditionalReserve bool
	// child makes the saga a child (child_test.go): ReserveInventory its
	// only step, the cancel declared, and outcome replies.
	child bool
	// group runs ReserveInventory and ReserveCredit as the parallel group
	// ReserveStock (see groupReserve).
	group bool
	// parent makes ReserveInventory a child step whose child tells of its
	// manual review with OrderInReview (child_test.go).
	parent bool
}

// placeOrder returns the compiled test definition: reserve inventory
// (compensatable), authorize payment (pivot), schedule shipping (retriable).
func placeOrder(t *testing.T, table string, o defOptions) *sagadef.Definition {
	t.Helper()
	if o.late == sagadef.LateUnspecified {
		o.late = defaultLatePolicy
	}
	if o.reserveTimeout == sagadef.TimeoutUnspecified {
		o.reserveTimeout = defaultReserveTimeout
	}
	if o.reserveMax == 0 {
		o.reserveMax = 1
	}
	if o.shippingMax == 0 {
		o.shippingMax = 3
	}
	if o.deadline == 0 {
		o.deadline = sagaDeadline
	}
	def := &sagadef.Definition{
		Name:         sagaTypeName,
		Table:        table,
		StartMessage: msgPlaceOrder.FullName,
		DataMessage:  sagaDataMessage,
		Deadline:     o.deadline,
		Steps: []sagadef.Step{
			{
				Name: "ReserveInventory", Role: sagadef.RoleCompensatable,
				Command:           msgReserveInventory.FullName,
				SuccessReplies:    []string{msgInventoryReserved.FullName},
				FailureReplies:    []string{msgInventoryFailed.FullName},
				Compensation:      msgReleaseInventory.FullName,
				CompensationReply: msgInventoryReleased.FullName,
				Timeout:           stepTimeout,
				OnTimeout:         o.reserveTimeout,
				MaxAttempts:       o.reserveMax,
				Late:              o.late,
			},
			{
				Name: "AuthorizePayment", Role: sagadef.RolePivot,
				Command:        msgAuthorizePayment.FullName,
				SuccessReplies: []string{msgPaymentAuthorized.FullName},
				FailureReplies: []string{msgPaymentDeclined.FullName},
				Timeout:        stepTimeout,
				OnTimeout:      sagadef.TimeoutCompensate,
				MaxAttempts:    1,
				Late:           o.late,
			},
			{
				Name: "ScheduleShipping", Role: sagadef.RoleRetriable,
				Command:        msgScheduleShipping.FullName,
				SuccessReplies: []string{msgShippingScheduled.FullName},
				Timeout:        stepTimeout,
				OnTimeout:      sagadef.TimeoutRetry,
				MaxAttempts:    o.shippingMax,
				Late:           o.late,
			},
		},
	}
	if o.shippingFails {
		def.Steps[2].FailureReplies = []string{msgShippingFailed.FullName}
	}
	if o.externalPayment {
		def.Steps[1].External, def.Steps[1].Command = true, ""
		def.Steps[1].SuccessReplies = []string{msgPaymentApproved.FullName}
	}
	if o.externalCheck {
		check := sagadef.Step{
			Name: "ApproveOrder", Role: sagadef.RoleCheck, External: true,
			SuccessReplies: []string{msgPaymentApproved.FullName},
			Timeout:        stepTimeout,
			OnTimeout:      sagadef.TimeoutCompensate,
			Late:           o.late,
		}
		def.Steps = append(def.Steps[:1], append([]sagadef.Step{check}, def.Steps[1:]...)...)
	}
	if o.conditionalReserve {
		def.Steps[0].Conditional = true
	}
	if o.group {
		groupReserve(def)
	}
	if o.cancel || o.child {
		def.Cancel = sagadef.Cancel{Message: msgCancelOrder.FullName, RequestedBy: "request_type_url", Reason: "response_type_url"}
	}
	if o.parent {
		def.Steps[0].Child, def.Steps[0].ChildReview = "test.pay.v1.Payment", msgChildInReview.FullName
	}
	if o.child {
		def.Steps = def.Steps[:1]
		def.Replies = sagadef.Replies{Completed: msgChildCompleted.FullName, Failed: msgChildFailed.FullName, Cancelled: msgChildCancelled.FullName,
			ManualReview: msgChildInReview.FullName}
	}
	require.NoError(t, def.Compile())
	return def
}

// clock is an injectable clock tests move by hand.
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

type testBundle struct {
	builds *atomic.Int64
	broken *atomic.Bool
	pool   *pgxpool.Pool
	engine *saga.Engine
	clock  *clock
	def    *sagadef.Definition
}

// setup gives each test its own schema with the runtime tables and the saga
// table of the test definition, and an engine on it.
func setup(t *testing.T, o defOptions) *testBundle {
	t.Helper()
	require.NoError(t, errReg)
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	def := placeOrder(t, "saga_place_order", o)
	testenv.CreateSagaTable(t, pool, def)
	b := &testBundle{builds: &atomic.Int64{}, broken: &atomic.Bool{}, pool: pool, clock: &clock{now: baseTime}, def: def}
	b.engine = b.newEngine(t, nil)
	return b
}

// newEngine returns an engine on the bundle's pool, definition, hooks and
// clock; edit adjusts its config first.
func (b *testBundle) newEngine(t *testing.T, edit func(*saga.Config)) *saga.Engine {
	t.Helper()
	cfg := saga.Config{
		Pool:           b.pool,
		Definition:     b.def,
		Hooks:          hooks{builds: b.builds, broken: b.broken},
		FailureBackoff: time.Minute,
		Logger:         slog.New(slog.DiscardHandler),
		Registry:       testRegistry,
		Now:            b.clock.Now,
	}
	if edit != nil {
		edit(&cfg)
	}
	eng, err := saga.New(cfg)
	require.NoError(t, err)
	return eng
}

// start starts a saga for order and returns its id.
func (b *testBundle) start(t *testing.T, order string) string {
	t.Helper()
	id, created, err := b.engine.Start(context.Background(), msg(msgPlaceOrder, order), message.Meta{MessageID: newID()})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

// reply delivers m to the saga in its own transaction, as the consumer
// would, with causation = the given command id. It returns the reply's
// message id and Handle's error.
func (b *testBundle) reply(t *testing.T, sagaID string, m testMsg, causation string) (string, error) {
	t.Helper()
	return b.replyWith(t, sagaID, m, causation, nil)
}

// replyWith is reply with the envelope's headers.
func (b *testBundle) replyWith(t *testing.T, sagaID string, m testMsg, causation string, headers map[string]any) (string, error) {
	t.Helper()
	env, err := message.New(m, message.Meta{SagaID: sagaID, SagaType: b.def.Name, CausationID: causation})
	require.NoError(t, err)
	env.Headers = headers
	d := &consumer.Delivery{Envelope: env, Message: m, Queue: "test.replies", Attempt: 1, ReceivedAt: time.Now()}
	return env.MessageID, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return b.engine.Handle(context.Background(), tx, d)
	})
}

// mustReply delivers m in answer to the saga's pending command.
func (b *testBundle) mustReply(t *testing.T, sagaID string, in *message.Info) saga.Status {
	t.Helper()
	st := b.status(t, sagaID)
	_, err := b.reply(t, sagaID, msg(in, st.BusinessKey), st.PendingMessageID)
	require.NoError(t, err)
	return b.status(t, sagaID)
}

func (b *testBundle) status(t *testing.T, sagaID string) saga.Status {
	t.Helper()
	st, err := b.engine.Status(context.Background(), sagaID)
	require.NoError(t, err)
	return st
}

func (b *testBundle) history(t *testing.T, sagaID string) []saga.AuditRecord {
	t.Helper()
	h, err := b.engine.History(context.Background(), sagaID)
	require.NoError(t, err)
	return h
}

// outboxRow is the part of a saga_outbox row the tests look at.
type outboxRow struct {
	MessageID, MessageType, CorrelationID, CausationID, SagaID, SagaType, IdempotencyKey string
}

func (b *testBundle) outbox(t *testing.T, sagaID string) []outboxRow {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT message_id, message_type, correlation_id, causation_id,
	saga_id, saga_type, idempotency_key FROM saga_outbox WHERE saga_id = $1 ORDER BY id`, sagaID)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	require.NoError(t, err)
	return out
}

func outboxTypes(rows []outboxRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = strings.TrimPrefix(r.MessageType, pkg)
	}
	return out
}

// trail summarizes audit rows as "trigger:class:from>to".
func trail(h []saga.AuditRecord) []string {
	out := make([]string, len(h))
	for i, a := range h {
		out[i] = fmt.Sprintf("%s:%s:%s>%s", strings.TrimPrefix(a.Trigger, pkg), a.Class, a.From, a.To)
	}
	return out
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }
