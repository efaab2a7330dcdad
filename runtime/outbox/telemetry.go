package outbox

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/telemetry"
)

// traceRows sets the trace context of the rows Enqueue writes. When ctx
// carries a recording span, each message gets a "create EXCHANGE" producer
// span (a child of it, from the same TracerProvider) whose context becomes
// the row's traceparent; when ctx carries a valid but non-recording span
// context, that context is written; otherwise the envelopes' own trace
// context stays. It returns the spans to end after the insert.
func traceRows(ctx context.Context, envs []message.Envelope, parents, states []string) []trace.Span {
	parent := trace.SpanFromContext(ctx)
	sc := parent.SpanContext()
	if !sc.IsValid() {
		return nil
	}
	if !parent.IsRecording() {
		tp, ts := telemetry.FormatSpanContext(sc)
		for i := range envs {
			parents[i], states[i] = tp, ts
		}
		return nil
	}
	tracer := parent.TracerProvider().Tracer(telemetry.ScopeName)
	spans := make([]trace.Span, len(envs))
	for i := range envs {
		e := &envs[i]
		_, span := tracer.Start(ctx, telemetry.SpanCreate+" "+e.Exchange,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(telemetry.MessageAttrs(e)...),
			trace.WithAttributes(
				telemetry.AttrRabbitMQ, telemetry.AttrOpCreate,
				telemetry.KeyOperationName.String("create"),
				telemetry.KeyDestinationName.String(e.Exchange),
				telemetry.KeyRoutingKey.String(e.RoutingKey),
				telemetry.KeyBodySize.Int(len(e.Body)),
				telemetry.AttrPostgreSQL,
				telemetry.KeyDBCollection.String("saga_outbox"),
				telemetry.KeyDBOperation.String("INSERT"),
			))
		parents[i], states[i] = telemetry.FormatSpanContext(span.SpanContext())
		spans[i] = span
	}
	return spans
}

// endSpans ends the create spans, recording err on each.
func endSpans(spans []trace.Span, err error) {
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "enqueue failed")
		}
		s.End()
	}
}

// relayTelemetry is a relay's instrumentation; its zero value does nothing.
type relayTelemetry struct {
	tracer  trace.Tracer // nil: no spans
	metrics *telemetry.Metrics
}

func newRelayTelemetry(p telemetry.Providers) (relayTelemetry, error) {
	m, err := telemetry.NewMetrics(p)
	if err != nil {
		return relayTelemetry{}, err
	}
	t := relayTelemetry{metrics: m}
	if p.TracingEnabled() {
		t.tracer = p.RuntimeTracer()
	}
	return t, nil
}

// startSend starts the publish span of a row, a child of the row's trace
// context. A row without a trace context gets the send span's, so the
// message is traced from here on.
func (t relayTelemetry) startSend(ctx context.Context, rw *row, owner string) trace.Span {
	if t.tracer == nil {
		return nil
	}
	e := &rw.env
	pctx := telemetry.Extract(ctx, e)
	_, span := t.tracer.Start(pctx, telemetry.SpanSend+" "+e.Exchange,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(telemetry.MessageAttrs(e)...),
		trace.WithAttributes(
			telemetry.AttrRabbitMQ, telemetry.AttrOpSend,
			telemetry.KeyOperationName.String("publish"),
			telemetry.KeyDestinationName.String(e.Exchange),
			telemetry.KeyRoutingKey.String(e.RoutingKey),
			telemetry.KeySagaAttempt.Int(int(rw.attempts)),
			telemetry.KeyBodySize.Int(len(e.Body)),
			attribute.String("saga.outbox.owner", owner),
		))
	if e.Traceparent == "" {
		e.Traceparent, e.Tracestate = telemetry.FormatSpanContext(span.SpanContext())
	}
	return span
}

// published records the outcome of one row's publish. Its delay runs from
// when the message occurred, or from when the row became pending again if
// that is later (an operator's replay of an old message).
func (t relayTelemetry) published(ctx context.Context, span trace.Span, rw *row, err error, now time.Time) {
	errType := publishErrorType(err)
	from := rw.env.OccurredAt
	if rw.pendingSince.Valid && rw.pendingSince.Time.After(from) {
		from = rw.pendingSince.Time
	}
	t.metrics.Sent(ctx, rw.env.Exchange, errType, now.Sub(from))
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, errType)
		span.SetAttributes(telemetry.KeyErrorType.String(errType))
	}
	span.End()
}

// publishErrorType is the error.type of a publish result ("" for success).
func publishErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, broker.ErrNacked):
		return "nacked"
	case errors.Is(err, broker.ErrReturned):
		return "returned"
	case errors.Is(err, broker.ErrNoExchange):
		return "no_exchange"
	case errors.Is(err, broker.ErrConfirmTimeout):
		return "confirm_timeout"
	case errors.Is(err, broker.ErrChannelClosed):
		return "channel_closed"
	case errors.Is(err, broker.ErrNotSent):
		return "not_sent"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	default:
		return "_OTHER"
	}
}
