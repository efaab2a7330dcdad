package wire_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/examples/placeorder/app"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

var update = flag.Bool("update", false, "rewrite the derived sections of docs/wire.md")

const docFile = "../../docs/wire.md"

// The values the examples show. The engine's ids and clock are fixed, so
// what it sends is reproduced exactly; the test's own messages use ids of
// their own.
var (
	clock       = time.Date(2030, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// Values a sender mints when it sends (a reply's message id and
	// occurred-at, a failure's time): the examples show these instead of
	// the ones minted in the run, after checking their form.
	mintedID   = "01906f3e-8c00-7e57-a000-00000000cafe"
	mintedTime = time.Date(2030, 1, 2, 3, 4, 6, 125_000_000, time.UTC)
)

// engineID is the n-th id the saga engine takes; testID one the test mints.
func engineID(n int64) string { return fmt.Sprintf("01906f3e-8c00-7000-8000-%012d", n) }
func testID(n int) string     { return fmt.Sprintf("01906f3e-8c00-7000-9000-%012d", n) }

// policy is the retry policy of every queue here: a tier long enough that a
// retry copy waits in it until the test takes it.
var policy = retry.Policy{Tiers: []time.Duration{time.Hour}, MaxAttempts: 3}

// TestWireExamples derives every example section of docs/wire.md from the
// runtime and compares them with the document; -update rewrites them.
func TestWireExamples(t *testing.T) {
	b := setup(t)
	sections := map[string]string{}
	b.derive(t, sections)
	raw, err := os.ReadFile(docFile)
	require.NoError(t, err)
	doc, err := replaceSections(string(raw), sections)
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.WriteFile(docFile, []byte(doc), 0o644))
		return
	}
	require.Equal(t, string(raw), doc,
		"the examples in %s are not what the runtime puts on the wire; if the change is intended, rerun with -update", docFile)
}

// Section markers: a derived section is the text between its begin and end
// lines.
var sectionRE = regexp.MustCompile(`(?m)^<!-- wire:([a-z-]+) is derived from the runtime: go test \./internal/wire -update -->\n`)

func endMarker(name string) string { return "<!-- end wire:" + name + " -->\n" }

// replaceSections returns doc with every derived section replaced by its
// content in sections. Every section must appear exactly once.
func replaceSections(doc string, sections map[string]string) (string, error) {
	var out strings.Builder
	seen := map[string]bool{}
	rest := doc
	for {
		loc := sectionRE.FindStringSubmatchIndex(rest)
		if loc == nil {
			out.WriteString(rest)
			break
		}
		name := rest[loc[2]:loc[3]]
		content, ok := sections[name]
		if !ok {
			return "", fmt.Errorf("%s has a section %q the test does not derive", docFile, name)
		}
		if seen[name] {
			return "", fmt.Errorf("%s has section %q twice", docFile, name)
		}
		seen[name] = true
		out.WriteString(rest[:loc[1]])
		end := strings.Index(rest[loc[1]:], endMarker(name))
		if end < 0 {
			return "", fmt.Errorf("%s: section %q has no end marker %q", docFile, name, strings.TrimSpace(endMarker(name)))
		}
		out.WriteString(content)
		out.WriteString(endMarker(name))
		rest = rest[loc[1]+end+len(endMarker(name)):]
	}
	var missing []string
	for name := range sections {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", fmt.Errorf("%s lacks the derived sections %v", docFile, missing)
	}
	return out.String(), nil
}

type bundle struct {
	ctx       context.Context
	pool      *pgxpool.Pool
	amqpURL   string
	publish   *broker.Conn
	ch        *amqp.Channel
	po        *orderv1.PlaceOrder
	ids       atomic.Int64
	later     atomic.Int64 // the engine's clock is clock plus this
	failing   atomic.Bool  // the payment participant fails while set
	log       *slog.Logger
	sagaReg   *message.Registry
	paymentRg *message.Registry
}

// Queues the test reads what is published from.
const (
	captureCommands      = "wire.capture.commands"
	captureReplies       = "wire.capture.replies"
	captureCompensations = "wire.capture.compensations"
	paymentQueue         = "payment.commands"
)

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := &bundle{ctx: ctx, pool: testenv.Postgres(t), amqpURL: testenv.AMQP(t), log: slog.New(slog.DiscardHandler)}
	require.NoError(t, schema.Migrate(ctx, b.pool, orderv1.PlaceOrderMigrations(), participant.Migrations))
	b.publish = b.dial(t, "wire-publish")
	var err error
	b.ch, err = b.publish.Channel(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.ch.Close() })

	top := orderv1.TopologyPlan.Topology(broker.QueueQuorum, policy).
		Merge(inventoryv1.TopologyPlan.Topology(broker.QueueQuorum, policy)).
		Merge(paymentv1.TopologyPlan.Topology(broker.QueueQuorum, policy)).
		Merge(shippingv1.TopologyPlan.Topology(broker.QueueQuorum, policy))
	top.Queues = append(top.Queues, broker.Queue{Name: captureCommands, Type: broker.QueueClassic}, broker.Queue{Name: captureReplies, Type: broker.QueueClassic},
		broker.Queue{Name: captureCompensations, Type: broker.QueueClassic})
	top.Bindings = append(top.Bindings,
		broker.Binding{Queue: captureCompensations, Exchange: inventoryv1.ReleaseInventoryInfo.Exchange, RoutingKey: inventoryv1.ReleaseInventoryInfo.RoutingKey},
		broker.Binding{Queue: captureCommands, Exchange: paymentv1.AuthorizePaymentInfo.Exchange, RoutingKey: paymentv1.AuthorizePaymentInfo.RoutingKey},
		broker.Binding{Queue: captureReplies, Exchange: paymentv1.PaymentAuthorizedInfo.Exchange, RoutingKey: paymentv1.PaymentAuthorizedInfo.RoutingKey})
	require.NoError(t, broker.Declare(ctx, b.ch, top))

	var infos []*message.Info
	for _, p := range []func() []*message.Info{
		func() []*message.Info { return orderv1.SagaPackage().Messages },
		func() []*message.Info { return inventoryv1.SagaPackage().Messages },
		func() []*message.Info { return paymentv1.SagaPackage().Messages },
		func() []*message.Info { return shippingv1.SagaPackage().Messages },
	} {
		infos = append(infos, p()...)
	}
	b.sagaReg, err = message.NewRegistry(infos...)
	require.NoError(t, err)
	b.paymentRg, err = message.NewRegistry(paymentv1.SagaPackage().Messages...)
	require.NoError(t, err)

	b.po, err = orderv1.NewPlaceOrder(saga.Config{
		Pool:   b.pool,
		Now:    func() time.Time { return clock.Add(time.Duration(b.later.Load())) },
		NewID:  func() string { return engineID(b.ids.Add(1)) },
		Logger: b.log,
	}, app.Decider{})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: b.publish, PollInterval: 20 * time.Millisecond, Logger: b.log})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return b
}

func (b *bundle) dial(t *testing.T, name string) *broker.Conn {
	t.Helper()
	c, err := broker.Dial(b.ctx, b.amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: b.log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// consume runs a consumer of queue until the test ends.
func (b *bundle) consume(t *testing.T, name, queue string, reg *message.Registry, h consumer.HandlerFunc) {
	t.Helper()
	c, err := consumer.New(consumer.Config{Name: name, Queue: queue, Pool: b.pool, Conn: b.dial(t, name), PublishConn: b.publish,
		Registry: reg, Handler: h, Retry: policy, Concurrency: 1, BatchSize: 1, Logger: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// get waits for a message in queue and takes it.
func (b *bundle) get(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		if ok {
			return d
		}
		require.True(t, time.Now().Before(deadline), "nothing arrived in %s", queue)
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bundle) send(t *testing.T, exchange, key string, p amqp.Publishing) {
	t.Helper()
	require.NoError(t, b.ch.PublishWithContext(b.ctx, exchange, key, false, false, p))
}

// payment answers AuthorizePayment with a fixed authorization, fails while
// b.failing is set, and fails for customer c-unavailable.
type payment struct{ b *bundle }

func (p payment) AuthorizePayment(_ context.Context, _ pgx.Tx, cmd *paymentv1.AuthorizePayment) (paymentv1.AuthorizePaymentResult, error) {
	if p.b.failing.Load() || cmd.GetCustomerId() == "c-unavailable" {
		return nil, errors.New("payment provider unavailable")
	}
	return &paymentv1.PaymentAuthorized{OrderId: cmd.GetOrderId(), AuthorizationId: "auth-7f3a"}, nil
}

func request(order string) *orderv1.PlaceOrderRequest {
	return &orderv1.PlaceOrderRequest{
		OrderId:         order,
		CustomerId:      "c-1",
		Lines:           []*commonv1.OrderLine{{ProductId: "widget", Quantity: 2}},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 4999},
		ShippingAddress: &commonv1.Address{Name: "A. Customer", Street: "1 Main St", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       "tok_visa",
	}
}

// deliver hands m to the saga's handler in a transaction of its own, as its
// consumer would.
func (b *bundle) deliver(t *testing.T, m message.Message, meta message.Meta) {
	t.Helper()
	env, err := message.New(m, meta)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.po.Engine().Handle(b.ctx, tx, &consumer.Delivery{Envelope: env, Message: m, Queue: b.po.Queue(), Attempt: 1, ReceivedAt: clock})
	}))
}

// derive runs the conversation the examples show and fills sections.
func (b *bundle) derive(t *testing.T, sections map[string]string) {
	// A saga started by an API call, its first step answered: the saga
	// sends AuthorizePayment.
	sagaID, _, err := b.po.Start(b.ctx, request("o-1001"), message.Meta{MessageID: testID(1), Traceparent: traceparent})
	require.NoError(t, err)
	st, err := b.po.Status(b.ctx, sagaID)
	require.NoError(t, err)
	reserve := st.PendingMessageID
	b.deliver(t, &inventoryv1.InventoryReserved{OrderId: "o-1001"}, message.Meta{MessageID: testID(2),
		SagaID: sagaID, SagaType: b.po.Engine().Definition().Name, CausationID: reserve, Traceparent: traceparent})
	// A second saga, whose command a misaddressed reply names below.
	other, _, err := b.po.Start(b.ctx, request("o-2002"), message.Meta{MessageID: testID(3)})
	require.NoError(t, err)
	otherSt, err := b.po.Status(b.ctx, other)
	require.NoError(t, err)

	// The second saga's reservation times out: the saga compensates the
	// step it stopped waiting for, naming the command it undoes.
	b.later.Store(int64(31 * time.Second))
	fired, err := b.po.Engine().FireTimeouts(b.ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, fired)

	cmd := b.get(t, captureCommands)
	sections["command"] = fence(render(cmd))
	sections["compensation"] = fence(render(b.get(t, captureCompensations)))

	// The participant fails: the consumer sends a copy to the tier queue.
	b.failing.Store(true)
	b.consume(t, "payment", paymentQueue, b.paymentRg,
		participant.Handler(participant.Idempotent("payment", b.paymentRg, paymentv1.PaymentParticipantFunc(payment{b}))))
	retried := b.get(t, broker.TierQueue(paymentQueue, time.Hour))
	mint(t, &retried, message.HeaderFirstFailureAt)
	sections["retry"] = fence(render(retried))

	// Back from the tier (as its TTL would send it), the command succeeds.
	b.failing.Store(false)
	b.send(t, "", paymentQueue, republish(retried))
	reply := b.get(t, captureReplies)
	mint(t, &reply, "message-id", "timestamp", message.HeaderOccurredAt)
	sections["reply"] = fence(render(reply))

	// A schema version newer than the participant knows: parked at once.
	newer := publishing(cmd)
	newer.MessageId = testID(4)
	newer.Headers[message.HeaderSchemaVersion] = int32(2)
	b.send(t, cmd.Exchange, cmd.RoutingKey, newer)
	parked := b.get(t, broker.ParkingQueue(paymentQueue))
	mint(t, &parked, message.HeaderFirstFailureAt)
	sections["parked"] = fence(render(parked))

	b.consume(t, "order-saga", b.po.Queue(), b.sagaReg, b.po.Engine().Handle)
	sections["park-reasons"] = b.parkReasons(t, cmd, sagaID, reserve, otherSt.PendingMessageID)
}

// breakCase is a message that breaks one rule of the protocol.
type breakCase struct {
	rule     string // what the message does wrong
	noID     bool   // sent without a message id
	queue    string // where it goes: the participant's or the saga's queue
	exchange string
	key      string
	p        amqp.Publishing
}

// parkReasons publishes one message breaking each rule and tabulates how
// each is parked.
func (b *bundle) parkReasons(t *testing.T, cmd amqp.Delivery, sagaID, reserve, otherReserve string) string {
	base := func() amqp.Publishing {
		p := publishing(cmd)
		p.MessageId = ""
		return p
	}
	reply := func(m message.Message, causation string) amqp.Publishing {
		env, err := message.New(m, message.Meta{SagaID: sagaID, SagaType: b.po.Engine().Definition().Name, CausationID: causation, OccurredAt: clock})
		require.NoError(t, err)
		return env.Publishing()
	}
	reserved := &inventoryv1.InventoryReserved{OrderId: "o-1001"}
	in := inventoryv1.InventoryReservedInfo
	var cases []breakCase
	onCommands := func(rule string, edit func(*amqp.Publishing)) {
		p := base()
		edit(&p)
		cases = append(cases, breakCase{rule: rule, queue: paymentQueue, exchange: cmd.Exchange, key: cmd.RoutingKey, p: p})
	}
	onSaga := func(rule string, p amqp.Publishing, edit func(*amqp.Publishing)) {
		if edit != nil {
			edit(&p)
		}
		cases = append(cases, breakCase{rule: rule, queue: b.po.Queue(), exchange: in.Exchange, key: in.RoutingKey, p: p})
	}
	onCommands("no `message-id` property", func(p *amqp.Publishing) {})
	cases[0].noID = true
	onCommands("no `type` property", func(p *amqp.Publishing) { p.Type = "" })
	onCommands("no `x-schema-version` header", func(p *amqp.Publishing) { delete(p.Headers, message.HeaderSchemaVersion) })
	onCommands("`x-schema-version` not an integer", func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = "two" })
	onCommands("`x-schema-version` below 1", func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = int32(0) })
	onCommands("a string header of another type (`x-saga-id` a boolean)", func(p *amqp.Publishing) { p.Headers[message.HeaderSagaID] = true })
	onCommands("`x-occurred-at` not an RFC 3339 time", func(p *amqp.Publishing) { p.Headers[message.HeaderOccurredAt] = "yesterday" })
	onCommands("a type the queue's consumer does not know", func(p *amqp.Publishing) { p.Type = "shop.payment.v1.RefundPayment" })
	onCommands("a schema version newer than the consumer's", func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = int32(2) })
	onCommands("a body that is not the type's protobuf encoding", func(p *amqp.Publishing) { p.Body = []byte{0x0a, 0xff} })
	onCommands("a command without its idempotency key (`order_id` empty)", func(p *amqp.Publishing) {
		body, err := proto.Marshal(&paymentv1.AuthorizePayment{CustomerId: "c-1"})
		require.NoError(t, err)
		p.Body = body
	})
	onCommands("a handler error on the last attempt (`x-attempt` 3 of 3)", func(p *amqp.Publishing) {
		body, err := proto.Marshal(&paymentv1.AuthorizePayment{OrderId: "o-3003", CustomerId: "c-unavailable"})
		require.NoError(t, err)
		p.Body = body
		p.Headers[message.HeaderIdempotency] = "o-3003"
		p.Headers[message.HeaderAttempt] = int32(3)
	})
	onSaga("`x-saga-id` not a UUID", reply(reserved, reserve), func(p *amqp.Publishing) { p.Headers[message.HeaderSagaID] = "o-1001" })
	onSaga("`x-saga-id` of no saga", reply(reserved, reserve), func(p *amqp.Publishing) {
		p.Headers[message.HeaderSagaID] = "01906f3e-8c00-7000-8000-0000000000ff"
	})
	onSaga("`x-saga-type` of another saga", reply(reserved, reserve), func(p *amqp.Publishing) { p.Headers[message.HeaderSagaType] = "shop.order.v1.ReturnOrder" })
	onSaga("a reply with neither `x-saga-id` nor a correlation key", reply(&inventoryv1.InventoryReserved{}, reserve), func(p *amqp.Publishing) {
		delete(p.Headers, message.HeaderSagaID)
	})
	onSaga("a reply without `x-causation-id`", reply(reserved, ""), nil)
	onSaga("a reply whose `x-causation-id` names no command the saga sent", reply(reserved, testID(99)), nil)
	onSaga("a reply whose `x-causation-id` names another saga's command", reply(reserved, otherReserve), nil)
	p := reply(&paymentv1.PaymentAuthorized{OrderId: "o-1001"}, reserve)
	cases = append(cases, breakCase{rule: "a reply whose `x-causation-id` names a command of another step",
		queue: b.po.Queue(), exchange: paymentv1.PaymentAuthorizedInfo.Exchange, key: paymentv1.PaymentAuthorizedInfo.RoutingKey, p: p})

	for i := range cases {
		c := &cases[i]
		if !c.noID {
			c.p.MessageId = testID(100 + i)
		}
		c.p.CorrelationId = fmt.Sprintf("break-%02d", i)
		b.send(t, c.exchange, c.key, c.p)
	}
	var out strings.Builder
	out.WriteString("| the message | queue | class | attempts | reason |\n|---|---|---|---|---|\n")
	for i, c := range cases {
		class, reason, attempts := b.parkedAs(t, fmt.Sprintf("break-%02d", i))
		fmt.Fprintf(&out, "| %s | %s | %s | %d | `%s` |\n", c.rule, c.queue, class, attempts, reason)
	}
	return out.String()
}

// undecodable cuts the protobuf library's own text from a reason: its
// wording and spacing are not stable across its releases.
var undecodable = regexp.MustCompile(`(undecodable body: .*?proto:).*`)

// parkedAs waits for the saga_parked row of the message with correlation id
// corr.
func (b *bundle) parkedAs(t *testing.T, corr string) (class, reason string, attempts int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := b.pool.QueryRow(b.ctx, `SELECT class, reason, attempts FROM saga_parked WHERE correlation_id = $1`, corr).
			Scan(&class, &reason, &attempts)
		if err == nil {
			return class, undecodable.ReplaceAllString(reason, "$1 …"), attempts
		}
		require.ErrorIs(t, err, pgx.ErrNoRows)
		require.True(t, time.Now().Before(deadline), "message %s was not parked", corr)
		time.Sleep(20 * time.Millisecond)
	}
}

// mint checks the values a sender mints (a message id, the timestamp
// property, time headers) and replaces them with the examples' values.
func mint(t *testing.T, d *amqp.Delivery, fields ...string) {
	t.Helper()
	for _, f := range fields {
		switch f {
		case "message-id":
			require.NoError(t, uuid.Validate(d.MessageId), "message id %q", d.MessageId)
			d.MessageId = mintedID
		case "timestamp":
			require.WithinDuration(t, time.Now(), d.Timestamp, time.Minute)
			d.Timestamp = mintedTime.Truncate(time.Second)
		default:
			v, ok := d.Headers[f].(string)
			require.True(t, ok, "header %s is %T, want a string", f, d.Headers[f])
			at, err := time.Parse(time.RFC3339Nano, v)
			require.NoError(t, err, "header %s", f)
			require.WithinDuration(t, time.Now(), at, time.Minute, "header %s", f)
			d.Headers[f] = mintedTime.Format(time.RFC3339Nano)
		}
	}
}

// publishing copies a delivery into a publishing with every property and
// header.
func publishing(d amqp.Delivery) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	return amqp.Publishing{Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, AppId: d.AppId, Body: d.Body}
}

// republish is a retry copy as its tier queue dead-letters it back.
func republish(d amqp.Delivery) amqp.Publishing { return publishing(d) }

func fence(s string) string { return "```text\n" + s + "```\n" }

// render writes a delivery as docs/wire.md shows messages: where it was
// published, its properties, its headers with their AMQP field types, and
// its body (the protobuf encoding, and the same as JSON).
func render(d amqp.Delivery) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exchange     %s\n", quoteEmpty(d.Exchange))
	fmt.Fprintf(&b, "routing key  %s\n", d.RoutingKey)
	b.WriteString("properties\n")
	props := [][2]string{
		{"app-id", d.AppId},
		{"content-encoding", d.ContentEncoding},
		{"content-type", d.ContentType},
		{"correlation-id", d.CorrelationId},
		{"expiration", d.Expiration},
		{"message-id", d.MessageId},
		{"reply-to", d.ReplyTo},
		{"type", d.Type},
		{"user-id", d.UserId},
	}
	if d.DeliveryMode != 0 {
		props = append(props, [2]string{"delivery-mode", fmt.Sprintf("%d", d.DeliveryMode)})
	}
	if d.Priority != 0 {
		props = append(props, [2]string{"priority", fmt.Sprintf("%d", d.Priority)})
	}
	if !d.Timestamp.IsZero() {
		props = append(props, [2]string{"timestamp", fmt.Sprintf("%d (%s)", d.Timestamp.Unix(), d.Timestamp.UTC().Format(time.RFC3339))})
	}
	slices.SortFunc(props, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	for _, p := range props {
		if p[1] != "" {
			fmt.Fprintf(&b, "  %-17s %s\n", p[0], p[1])
		}
	}
	b.WriteString("headers\n")
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if !brokerHeader(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		typ, val := field(d.Headers[k])
		fmt.Fprintf(&b, "  %-22s %-6s %s\n", k, typ, val)
	}
	fmt.Fprintf(&b, "body (%d bytes)\n", len(d.Body))
	if js := bodyJSON(d.Type, d.Body); js != "" {
		fmt.Fprintf(&b, "  json  %s\n", js)
	}
	h := hex.EncodeToString(d.Body)
	for i := 0; i < len(h); i += 64 {
		lead := "  hex   "
		if i > 0 {
			lead = "        "
		}
		fmt.Fprintf(&b, "%s%s\n", lead, h[i:min(i+64, len(h))])
	}
	return b.String()
}

// brokerHeader reports whether RabbitMQ, not the sender, sets header k
// (delivery counts of quorum queues, dead-letter history): what it holds
// depends on the broker's version, and the examples leave it out.
func brokerHeader(k string) bool {
	return k == "x-delivery-count" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

func quoteEmpty(s string) string {
	if s == "" {
		return `"" (the default exchange)`
	}
	return s
}

// field names a header value's AMQP field type as amqp091-go decodes it and
// formats the value.
func field(v any) (typ, val string) {
	switch x := v.(type) {
	case string:
		return "string", x
	case int32:
		return "int32", fmt.Sprint(x)
	case int64:
		return "int64", fmt.Sprint(x)
	case bool:
		return "bool", fmt.Sprint(x)
	case time.Time:
		return "time", x.UTC().Format(time.RFC3339)
	case []byte:
		return "bytes", hex.EncodeToString(x)
	default:
		return fmt.Sprintf("%T", v), fmt.Sprint(v)
	}
}

// bodyJSON is the body as compact JSON (proto field names), or "" when the
// type is not one of Place Order's.
func bodyJSON(typ string, body []byte) string {
	infos := slices.Concat(orderv1.SagaPackage().Messages, inventoryv1.SagaPackage().Messages,
		paymentv1.SagaPackage().Messages, shippingv1.SagaPackage().Messages)
	for _, in := range infos {
		if in.FullName != typ {
			continue
		}
		m := in.New()
		if err := proto.Unmarshal(body, m); err != nil {
			return ""
		}
		js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			return ""
		}
		var out bytes.Buffer
		if err := json.Compact(&out, js); err != nil {
			return ""
		}
		return out.String()
	}
	return ""
}
