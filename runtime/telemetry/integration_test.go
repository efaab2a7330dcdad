package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	_ "google.golang.org/protobuf/types/known/structpb" // saga data type

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry"
)

// The test contract: a two-step order saga. Reserve is compensatable and
// compensates on timeout; Charge is the pivot and goes to manual review on
// timeout. Late replies are ignored (and audited).
var (
	tPlaceOrder    = sagatest.NewType("tel.v1.PlaceOrder", message.KindCommand)
	tReserve       = sagatest.NewType("tel.v1.Reserve", message.KindCommand)
	tReserved      = sagatest.NewType("tel.v1.Reserved", message.KindReply)
	tReserveFailed = sagatest.NewType("tel.v1.ReserveFailed", message.KindReply)
	tRelease       = sagatest.NewType("tel.v1.Release", message.KindCommand)
	tReleased      = sagatest.NewType("tel.v1.Released", message.KindReply)
	tCharge        = sagatest.NewType("tel.v1.Charge", message.KindCommand)
	tCharged       = sagatest.NewType("tel.v1.Charged", message.KindReply)
	tDeclined      = sagatest.NewType("tel.v1.ChargeDeclined", message.KindReply)
	allTypes       = []*message.Info{tPlaceOrder, tReserve, tReserved, tReserveFailed, tRelease, tReleased, tCharge, tCharged, tDeclined}
)

const (
	commandQueue = "tel.commands"
	replyQueue   = "tel.replies"
	stepTimeout  = 10 * time.Second
)

func orderDefinition(t testing.TB) *sagadef.Definition {
	t.Helper()
	def := &sagadef.Definition{
		Name:         "tel.v1.Order",
		Table:        "saga_tel_order",
		StartMessage: tPlaceOrder.FullName,
		DataMessage:  "google.protobuf.Struct",
		Steps: []sagadef.Step{
			{
				Name: "Reserve", Role: sagadef.RoleCompensatable,
				Command: tReserve.FullName, SuccessReplies: []string{tReserved.FullName}, FailureReplies: []string{tReserveFailed.FullName},
				Compensation: tRelease.FullName, CompensationReply: tReleased.FullName,
				Timeout: stepTimeout, OnTimeout: sagadef.TimeoutCompensate, MaxAttempts: 1, Late: sagadef.LateIgnore,
			},
			{
				Name: "Charge", Role: sagadef.RolePivot,
				Command: tCharge.FullName, SuccessReplies: []string{tCharged.FullName}, FailureReplies: []string{tDeclined.FullName},
				Timeout: stepTimeout, OnTimeout: sagadef.TimeoutManualReview, MaxAttempts: 1, Late: sagadef.LateIgnore,
			},
		},
	}
	require.NoError(t, def.Compile())
	return def
}

// world is one database schema and one broker vhost shared by several
// "processes", each with pools and connections of its own.
type world struct {
	t       testing.TB
	ctx     context.Context
	url     string
	amqpURL string
	def     *sagadef.Definition
	reg     *message.Registry
	policy  retry.Policy
}

func newWorld(t testing.TB) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{
		t: t, ctx: ctx, url: testenv.PostgresURL(t), amqpURL: testenv.AMQP(t), def: orderDefinition(t),
		policy: retry.Policy{Tiers: []time.Duration{50 * time.Millisecond}, MaxAttempts: 3},
	}
	var err error
	w.reg, err = message.NewRegistry(allTypes...)
	require.NoError(t, err)
	pool := w.pool()
	require.NoError(t, schema.Migrate(ctx, pool, participant.Migrations))
	testenv.CreateSagaTable(t, pool, w.def)

	conn := w.conn("setup")
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	queues := append(broker.WorkQueue(commandQueue, broker.QueueQuorum, w.policy), broker.WorkQueue(replyQueue, broker.QueueQuorum, w.policy)...)
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: tReserve.Exchange}, {Name: tReserved.Exchange}},
		Queues:    queues,
		Bindings: []broker.Binding{
			{Queue: commandQueue, Exchange: tReserve.Exchange, RoutingKey: "tel.v1.#"},
			{Queue: replyQueue, Exchange: tReserved.Exchange, RoutingKey: "tel.v1.#"},
		},
	}))
	return w
}

// pool opens a pool of its own on the world's schema.
func (w *world) pool() *pgxpool.Pool {
	w.t.Helper()
	p, err := pgxpool.New(w.ctx, w.url)
	require.NoError(w.t, err)
	w.t.Cleanup(p.Close)
	return p
}

// conn dials a broker connection of its own.
func (w *world) conn(name string) *broker.Conn {
	w.t.Helper()
	c, err := broker.Dial(w.ctx, w.amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	require.NoError(w.t, err)
	w.t.Cleanup(func() { _ = c.Close() })
	return c
}

// run runs fn until the test ends.
func (w *world) run(name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("%s: %v", name, err)
		}
	})
}

// engine returns a saga engine on a pool of its own.
func (w *world) engine(p telemetry.Providers, hooks sagadef.Hooks, now func() time.Time) *saga.Engine {
	w.t.Helper()
	if hooks == nil {
		hooks = sagatest.Hooks(allTypes...)
	}
	e, err := saga.New(saga.Config{
		Pool: w.pool(), Definition: w.def, Hooks: hooks, Registry: w.reg, Now: now,
		Logger: slog.New(slog.DiscardHandler), Telemetry: p,
	})
	require.NoError(w.t, err)
	return e
}

// consume runs a consumer of queue with handler, on a pool and a
// connection of its own.
func (w *world) consume(name, queue string, p telemetry.Providers, handler consumer.HandlerFunc) {
	w.t.Helper()
	c, err := consumer.New(consumer.Config{
		Name: name, Queue: queue, Pool: w.pool(), Conn: w.conn(name), Registry: w.reg, Handler: handler,
		Concurrency: 2, BatchSize: 4, Retry: w.policy, Logger: slog.New(slog.DiscardHandler), Telemetry: p,
	})
	require.NoError(w.t, err)
	w.run(name, c.Run)
}

// relay runs an outbox relay on a pool and a connection of its own.
func (w *world) relay(p telemetry.Providers) {
	w.t.Helper()
	r, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: w.pool(), Conn: w.conn("relay"), PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Telemetry: p,
	})
	require.NoError(w.t, err)
	w.run("relay", r.Run)
}

// tracing returns a tracer provider exporting synchronously to memory.
func tracing(t testing.TB) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// inventory is the participant: it answers Reserve with Reserved and
// Charge with Charged.
func inventory(_ context.Context, _ pgx.Tx, cmd message.Message) (message.Message, error) {
	key := cmd.CorrelationKey()
	switch cmd.SagaMessageInfo().FullName {
	case tReserve.FullName:
		return sagatest.NewMessage(tReserved, key), nil
	case tCharge.FullName:
		return sagatest.NewMessage(tCharged, key), nil
	case tRelease.FullName:
		return sagatest.NewMessage(tReleased, key), nil
	}
	return nil, fmt.Errorf("inventory: unexpected command %s", cmd.SagaMessageInfo().FullName)
}

// TestOneTraceAcrossProcesses runs a saga through four "processes" (API,
// relay, participant, orchestrator), each with its own tracer provider,
// exporter, pool and broker connection, and checks that every span belongs
// to the trace the API request started and that each span's parent is the
// one the design says.
func TestOneTraceAcrossProcesses(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	apiTP, apiExp := tracing(t)
	relayTP, relayExp := tracing(t)
	partTP, partExp := tracing(t)
	sagaTP, sagaExp := tracing(t)

	api := w.engine(telemetry.Providers{Tracer: apiTP}, nil, nil)
	orchestrator := w.engine(telemetry.Providers{Tracer: sagaTP}, nil, nil)
	w.relay(telemetry.Providers{Tracer: relayTP})
	w.consume("inventory", commandQueue, telemetry.Providers{Tracer: partTP}, participant.Handler(inventory))
	w.consume("orchestrator", replyQueue, telemetry.Providers{Tracer: sagaTP}, orchestrator.Handle)

	ctx, root := apiTP.Tracer("test").Start(w.ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	sagaID, created, err := api.Start(ctx, sagatest.NewMessage(tPlaceOrder, "order-1"), message.Meta{})
	root.End()
	require.NoError(t, err)
	require.True(t, created)

	require.Eventually(t, func() bool {
		st, err := api.Status(w.ctx, sagaID)
		return err == nil && st.State == sagadef.StateCompleted
	}, 30*time.Second, 20*time.Millisecond)

	// Every span has ended once the last reply's process span has: wait
	// for the full set (18 in all).
	all := func() []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, e := range []*tracetest.InMemoryExporter{apiExp, relayExp, partExp, sagaExp} {
			for _, s := range e.GetSpans() {
				out = append(out, s.Snapshot())
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(all()) >= 18 }, 10*time.Second, 10*time.Millisecond)
	spans := all()

	traceID := root.SpanContext().TraceID()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		require.Equal(t, traceID, s.SpanContext().TraceID(), "span %q is in another trace", s.Name())
		byID[s.SpanContext().SpanID()] = s
	}
	// find returns the one span with name and message id.
	find := func(name, messageType string) sdktrace.ReadOnlySpan {
		t.Helper()
		var found []sdktrace.ReadOnlySpan
		for _, s := range spans {
			if s.Name() == name && (messageType == "" || attr(s, telemetry.KeyMessageType) == messageType) {
				found = append(found, s)
			}
		}
		require.Len(t, found, 1, "spans named %q for %q", name, messageType)
		return found[0]
	}
	requireParent := func(child, parent sdktrace.ReadOnlySpan) {
		t.Helper()
		require.Equal(t, parent.SpanContext().SpanID(), child.Parent().SpanID(),
			"parent of %q (%s) is %v, want %q", child.Name(), attr(child, telemetry.KeyMessageType), nameOf(byID, child.Parent().SpanID()), parent.Name())
	}

	rootSpan := find("POST /orders", "")
	start := find("saga.start tel.v1.Order", "")
	requireParent(start, rootSpan)
	require.Equal(t, sagaID, attr(start, telemetry.KeySagaID))

	// Each message: created under its cause, sent by the relay and
	// processed by the consumer as children of its creation context.
	type hop struct{ msgType, create, send, process string }
	hops := []hop{
		{tReserve.FullName, "create sagatest.command", "send sagatest.command", "process " + commandQueue},
		{tReserved.FullName, "create sagatest.reply", "send sagatest.reply", "process " + replyQueue},
		{tCharge.FullName, "create sagatest.command", "send sagatest.command", "process " + commandQueue},
		{tCharged.FullName, "create sagatest.reply", "send sagatest.reply", "process " + replyQueue},
	}
	creates := map[string]sdktrace.ReadOnlySpan{}
	processes := map[string]sdktrace.ReadOnlySpan{}
	for _, h := range hops {
		c := find(h.create, h.msgType)
		require.Equal(t, trace.SpanKindProducer, c.SpanKind())
		s := find(h.send, h.msgType)
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		requireParent(s, c)
		require.Equal(t, attr(c, telemetry.KeyMessageID), attr(s, telemetry.KeyMessageID))
		p := processSpan(t, spans, h.process, attr(c, telemetry.KeyMessageID))
		require.Equal(t, trace.SpanKindConsumer, p.SpanKind())
		requireParent(p, c)
		require.True(t, p.Parent().IsRemote(), "process span's parent comes from the message")
		require.Equal(t, "processed", attr(p, telemetry.KeyConsumerOutcome))
		creates[h.msgType], processes[h.msgType] = c, p
	}
	requireParent(creates[tReserve.FullName], start)

	// The participant span sits under the command's process span and
	// parents the reply's create span.
	for _, pair := range [][2]string{{tReserve.FullName, tReserved.FullName}, {tCharge.FullName, tCharged.FullName}} {
		part := find("participant "+pair[0], pair[0])
		requireParent(part, processes[pair[0]])
		requireParent(creates[pair[1]], part)
	}

	// The transition on Reserved sends Charge: process → transition →
	// create(Charge). The transition on Charged completes the saga.
	var transitions []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "saga.transition tel.v1.Order" {
			transitions = append(transitions, s)
		}
	}
	require.Len(t, transitions, 2)
	byTrigger := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range transitions {
		byTrigger[attr(s, telemetry.KeySagaTrigger)] = s
	}
	onReserved, onCharged := byTrigger[tReserved.FullName], byTrigger[tCharged.FullName]
	require.NotNil(t, onReserved)
	require.NotNil(t, onCharged)
	requireParent(onReserved, processes[tReserved.FullName])
	requireParent(onCharged, processes[tCharged.FullName])
	requireParent(creates[tCharge.FullName], onReserved)
	require.Equal(t, map[string]string{
		"saga.id": sagaID, "saga.type": "tel.v1.Order", "saga.step": "Reserve",
		"saga.state.from": sagadef.StateName("Reserve"), "saga.state.to": sagadef.StateName("Charge"),
		"saga.class": "new", "saga.attempt": "1",
		"messaging.message.id":              attr(processes[tReserved.FullName], telemetry.KeyMessageID),
		"messaging.message.conversation_id": sagaID,
		"saga.causation_id":                 attr(creates[tReserve.FullName], telemetry.KeyMessageID),
	}, attrs(onReserved, "saga.id", "saga.type", "saga.step", "saga.state.from", "saga.state.to", "saga.class", "saga.attempt",
		"messaging.message.id", "messaging.message.conversation_id", "saga.causation_id"))
	require.Equal(t, sagadef.StateCompleted, attr(onCharged, telemetry.KeyStateTo))

	// The processes' exporters saw only their own spans: the context
	// crossed process boundaries in the outbox row and the AMQP headers.
	require.Len(t, relayExp.GetSpans(), 4)
	for _, s := range relayExp.GetSpans() {
		require.True(t, s.Parent.IsRemote())
	}
}

// processSpan returns the process span of queue for message id.
func processSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, name, messageID string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && attr(s, telemetry.KeyMessageID) == messageID {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "process spans of %s", messageID)
	return found[0]
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.String()
		}
	}
	return ""
}

func attrs(s sdktrace.ReadOnlySpan, keys ...string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		out[k] = attr(s, attribute.Key(k))
	}
	return out
}

func nameOf(byID map[trace.SpanID]sdktrace.ReadOnlySpan, id trace.SpanID) string {
	if s, ok := byID[id]; ok {
		return s.Name()
	}
	return id.String()
}

// flakyHooks fails the first Apply of a reply for business key "flaky".
type flakyHooks struct {
	sagadef.Hooks
	failed atomic.Bool
}

func (h *flakyHooks) Apply(ctx context.Context, data proto.Message, m message.Message) error {
	if m.CorrelationKey() == "flaky" && h.failed.CompareAndSwap(false, true) {
		return errors.New("inventory service unavailable")
	}
	return h.Hooks.Apply(ctx, data, m)
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestMetricsAfterKnownEvents drives an orchestrator (engine + consumer,
// no relay: commands stay in the outbox) through known events — a consumer
// duplicate, a saga-level duplicate, a retried reply, timeouts with a
// compensation and manual reviews, a late reply and a parked message — and
// checks every counter, histogram and database gauge against them.
func TestMetricsAfterKnownEvents(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	mp := metrictest.New(t)
	p := telemetry.Providers{Meter: mp}

	// The engine's clock runs an hour behind, so instances look idle for
	// an hour to the database (updated_at) and count as stuck.
	clk := &clock{now: time.Now().Add(-time.Hour)}
	hooks := &flakyHooks{Hooks: sagatest.Hooks(allTypes...)}
	eng := w.engine(p, hooks, clk.Now)
	w.consume("orchestrator", replyQueue, p, eng.Handle)
	gaugePool := w.pool()
	_, err := saga.RegisterGauges(mp.Meter("gauges"), gaugePool, []*sagadef.Definition{w.def}, telemetry.WithStuckGrace(-1))
	require.NoError(t, err)
	_, err = outbox.RegisterGauges(mp.Meter("gauges"), gaugePool)
	require.NoError(t, err)

	pub := broker.NewPublisher(w.conn("test-publisher"), broker.PublisherConfig{})
	t.Cleanup(func() { _ = pub.Close() })
	send := func(env message.Envelope) {
		t.Helper()
		errs := pub.Publish(w.ctx, []broker.Outgoing{{Exchange: env.Exchange, RoutingKey: env.RoutingKey, Publishing: env.Publishing()}})
		require.NoError(t, errs[0])
	}
	reply := func(sagaID string, info *message.Info, key, causation string) message.Envelope {
		t.Helper()
		env, err := message.New(sagatest.NewMessage(info, key), message.Meta{SagaID: sagaID, SagaType: w.def.Name, CausationID: causation})
		require.NoError(t, err)
		return env
	}
	status := func(id string) saga.Status {
		t.Helper()
		st, err := eng.Status(w.ctx, id)
		require.NoError(t, err)
		return st
	}
	eventually := func(name string, labels map[string]string, want float64) {
		t.Helper()
		require.Eventually(t, func() bool { return mp.Value(t, name, labels) == want }, 20*time.Second, 10*time.Millisecond,
			"%s%v: have %v, want %v", name, labels, mp.Value(t, name, labels), want)
	}

	ids := map[string]string{}
	pending := map[string]string{}
	for _, key := range []string{"k1", "k2", "flaky"} {
		id, created, err := eng.Start(w.ctx, sagatest.NewMessage(tPlaceOrder, key), message.Meta{})
		require.NoError(t, err)
		require.True(t, created)
		ids[key], pending[key] = id, status(id).PendingMessageID
	}
	eventually(telemetry.MetricTransitions, map[string]string{"saga.result": "applied", "saga.trigger.type": "start"}, 3)

	// k1: Reserved is applied (Reserve's round trip) and sends Charge.
	r1 := reply(ids["k1"], tReserved, "k1", pending["k1"])
	send(r1)
	eventually(telemetry.MetricTransitions, map[string]string{"saga.result": "applied", "saga.trigger.type": "message"}, 1)
	eventually(telemetry.MetricStepRoundTrip, map[string]string{"saga.type": "tel.v1.Order", "saga.step": "Reserve", "saga.step.phase": "forward"}, 1)
	// The reply made the saga send Charge's command: the step latency
	// (reply in → next command out) is Charge's.
	eventually(telemetry.MetricStepLatency, map[string]string{"saga.type": "tel.v1.Order", "saga.step": "Charge", "saga.step.phase": "forward"}, 1)

	// The same delivery again: the consumer's inbox drops it.
	send(r1)
	eventually(telemetry.MetricConsumerMessages, map[string]string{"saga.consumer.outcome": "duplicate"}, 1)

	// The same reply with a new message id: the saga classifies it as a
	// duplicate.
	send(reply(ids["k1"], tReserved, "k1", pending["k1"]))
	eventually(telemetry.MetricTransitions, map[string]string{"saga.result": "duplicate"}, 1)

	// flaky: the first attempt fails (unclassified), the retry applies it.
	send(reply(ids["flaky"], tReserved, "flaky", pending["flaky"]))
	eventually(telemetry.MetricConsumerRetries, map[string]string{"saga.retry.reason": "unknown", "messaging.destination.name": replyQueue}, 1)
	eventually(telemetry.MetricTransitions, map[string]string{"saga.result": "applied", "saga.trigger.type": "message"}, 2)
	// Transition metrics are recorded after the consumer's commit, and
	// its state is read back here: wait for it all the same.
	require.Eventually(t, func() bool { return status(ids["flaky"]).State == sagadef.StateName("Charge") },
		20*time.Second, 10*time.Millisecond, "flaky reaches CHARGE once its retry commits")

	// Past the step timeout: k2 (Reserve) compensates, k1 and flaky
	// (Charge) go to manual review.
	clk.Advance(stepTimeout + time.Second)
	fired, err := eng.FireTimeouts(w.ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 3, fired)
	require.Equal(t, 3.0, mp.Value(t, telemetry.MetricTimeouts, map[string]string{"saga.timeout.kind": "timeout"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTimeouts, map[string]string{"saga.step": "Reserve"}))
	require.Equal(t, 2.0, mp.Value(t, telemetry.MetricTimeouts, map[string]string{"saga.step": "Charge"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricCompensations, map[string]string{"saga.step": "Reserve"}))
	require.Equal(t, 2.0, mp.Value(t, telemetry.MetricManualReviews, map[string]string{"saga.trigger.type": "timeout"}))

	// k2's Reserved arrives after its timeout: late, ignored.
	send(reply(ids["k2"], tReserved, "k2", pending["k2"]))
	eventually(telemetry.MetricTransitions, map[string]string{"saga.result": "late"}, 1)

	// A message of a type nobody knows is parked.
	bad := reply(ids["k2"], tReserved, "k2", "")
	pb := bad.Publishing()
	pb.Type = "tel.v1.Unknown"
	require.NoError(t, pub.Publish(w.ctx, []broker.Outgoing{{Exchange: bad.Exchange, RoutingKey: bad.RoutingKey, Publishing: pb}})[0])
	eventually(telemetry.MetricConsumerParked, map[string]string{"saga.park.class": "permanent", "saga.park.reason": "unknown_type"}, 1)

	// Every settled delivery, by outcome.
	for outcome, n := range map[string]float64{"processed": 4, "duplicate": 1, "retry": 1, "park": 1} {
		require.Equal(t, n, mp.Value(t, telemetry.MetricConsumerMessages, map[string]string{"saga.consumer.outcome": outcome}), outcome)
		require.Equal(t, n, mp.Value(t, telemetry.MetricProcessDuration, map[string]string{"saga.consumer.outcome": outcome}), outcome)
	}
	require.Equal(t, 7.0, mp.Value(t, telemetry.MetricConsumed, map[string]string{"messaging.consumer.group.name": "orchestrator"}))
	require.Equal(t, 0.0, mp.Value(t, telemetry.MetricTransitions, map[string]string{"saga.result": "invalid"}))

	// Database gauges.
	state := func(s string) map[string]string {
		return map[string]string{"saga.type": "tel.v1.Order", "saga.state": s}
	}
	require.Equal(t, 2.0, mp.Value(t, telemetry.MetricInstances, state(sagadef.StateManualReview)))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricInstances, state(sagadef.CompensatingStateName("Reserve"))))
	require.Equal(t, 0.0, mp.Value(t, telemetry.MetricInstances, state(sagadef.StateName("Charge"))))
	require.True(t, mp.Has(t, telemetry.MetricInstances, state(sagadef.StateName("Reserve"))), "empty states are reported as 0")
	require.False(t, mp.Has(t, telemetry.MetricInstances, state(sagadef.StateCompleted)), "terminal states are off by default")
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricStuck, state(sagadef.CompensatingStateName("Reserve"))))
	require.False(t, mp.Has(t, telemetry.MetricStuck, state(sagadef.StateManualReview)), "manual review is not 'stuck'")
	// Progress now, but its timeout overdue and not fired (no scanner
	// runs): still stuck, as the admin console says (saga.StuckRule).
	_, err = gaugePool.Exec(w.ctx, `UPDATE saga_tel_order SET updated_at = now(), timeout_at = now() - interval '1 minute' WHERE business_key = 'k2'`)
	require.NoError(t, err)
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricStuck, state(sagadef.CompensatingStateName("Reserve"))))
	// With its timeout armed anew: no longer stuck.
	_, err = gaugePool.Exec(w.ctx, `UPDATE saga_tel_order SET timeout_at = now() + interval '1 minute' WHERE business_key = 'k2'`)
	require.NoError(t, err)
	require.Equal(t, 0.0, mp.Value(t, telemetry.MetricStuck, state(sagadef.CompensatingStateName("Reserve"))))

	// Commands wait in the outbox (no relay runs): Reserve ×3, Charge ×2,
	// Release ×1.
	require.Equal(t, 6.0, mp.Value(t, telemetry.MetricOutboxBacklog, nil))
	oldest := mp.Value(t, telemetry.MetricOutboxOldestAge, nil)
	require.Greater(t, oldest, 0.0)
	// A pending row whose outbox row was deleted by hand (pending since
	// now) counts in the backlog but does not hide the age of the oldest
	// real one.
	_, err = gaugePool.Exec(w.ctx, `INSERT INTO saga_outbox_pending (id) VALUES (-1)`)
	require.NoError(t, err)
	require.Equal(t, 7.0, mp.Value(t, telemetry.MetricOutboxBacklog, nil))
	require.GreaterOrEqual(t, mp.Value(t, telemetry.MetricOutboxOldestAge, nil), oldest, "the newest pending row hid the oldest")
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricParkedMessages, map[string]string{"messaging.destination.name": replyQueue}))
	// Dismissed by an operator: the queue's gauge returns to 0 instead of
	// disappearing, so an alert on it clears, even for a collector that
	// never saw it open.
	_, err = gaugePool.Exec(w.ctx, `UPDATE saga_parked SET dismissed_at = now(), dismissed_by = 'alice', dismiss_reason = 'test'`)
	require.NoError(t, err)
	require.True(t, mp.Has(t, telemetry.MetricParkedMessages, map[string]string{"messaging.destination.name": replyQueue}))
	require.Equal(t, 0.0, mp.Value(t, telemetry.MetricParkedMessages, map[string]string{"messaging.destination.name": replyQueue}))
	fresh := metrictest.New(t)
	_, err = outbox.RegisterGauges(fresh.Meter("gauges"), gaugePool)
	require.NoError(t, err)
	require.True(t, fresh.Has(t, telemetry.MetricParkedMessages, map[string]string{"messaging.destination.name": replyQueue}))
	require.Equal(t, 0.0, fresh.Value(t, telemetry.MetricParkedMessages, map[string]string{"messaging.destination.name": replyQueue}))
}

// TestTimeoutLinksToTheUnansweredCommand: a fired timeout starts a trace of
// its own, linked to the trace of the command that went unanswered.
func TestTimeoutLinksToTheUnansweredCommand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tp, exp := tracing(t)
	clk := &clock{now: time.Now()}
	eng := w.engine(telemetry.Providers{Tracer: tp}, nil, clk.Now)

	ctx, root := tp.Tracer("test").Start(w.ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	_, created, err := eng.Start(ctx, sagatest.NewMessage(tPlaceOrder, "order-late"), message.Meta{})
	root.End()
	require.NoError(t, err)
	require.True(t, created)

	clk.Advance(stepTimeout + time.Second)
	fired, err := eng.FireTimeouts(w.ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, fired)

	var timeouts []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		for _, a := range s.Attributes() {
			if a.Key == telemetry.KeySagaTrigger && a.Value.AsString() == sagadef.TriggerTimeout {
				timeouts = append(timeouts, s)
			}
		}
	}
	require.Len(t, timeouts, 1)
	span := timeouts[0]
	require.False(t, span.Parent().IsValid(), "a timeout starts a trace of its own")
	require.NotEqual(t, root.SpanContext().TraceID(), span.SpanContext().TraceID())
	require.Len(t, span.Links(), 1)
	require.Equal(t, root.SpanContext().TraceID(), span.Links()[0].SpanContext.TraceID(),
		"linked to the trace that sent the command that timed out")
}
