package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/message"
)

// w3c is the W3C Trace Context propagator. It is stateless; the runtime
// never consults the global propagator.
var w3c propagation.TraceContext

// traceCarrier holds the two W3C headers.
type traceCarrier struct{ traceparent, tracestate string }

func (c *traceCarrier) Get(key string) string {
	switch key {
	case message.HeaderTraceparent:
		return c.traceparent
	case message.HeaderTracestate:
		return c.tracestate
	}
	return ""
}

func (c *traceCarrier) Set(key, value string) {
	switch key {
	case message.HeaderTraceparent:
		c.traceparent = value
	case message.HeaderTracestate:
		c.tracestate = value
	}
}

func (c *traceCarrier) Keys() []string {
	return []string{message.HeaderTraceparent, message.HeaderTracestate}
}

// TraceContext returns the W3C traceparent and tracestate of the span
// context in ctx; both are empty when ctx carries no valid span context.
func TraceContext(ctx context.Context) (traceparent, tracestate string) {
	return FormatSpanContext(trace.SpanContextFromContext(ctx))
}

// FormatSpanContext returns the W3C traceparent and tracestate of sc; both
// are empty when sc is invalid.
func FormatSpanContext(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	var c traceCarrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	return c.traceparent, c.tracestate
}

// ParseSpanContext is the span context a W3C traceparent and tracestate
// describe; invalid when traceparent is empty or malformed.
func ParseSpanContext(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := traceCarrier{traceparent: traceparent, tracestate: tracestate}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &c))
}

// Inject writes the span context of ctx into e's Traceparent and
// Tracestate. When ctx carries no valid span context, e keeps the trace
// context it has (so a process without tracing passes it through); Inject
// reports whether it wrote.
func Inject(ctx context.Context, e *message.Envelope) bool {
	tp, ts := TraceContext(ctx)
	if tp == "" {
		return false
	}
	e.Traceparent, e.Tracestate = tp, ts
	return true
}

// ParseTraceparent returns the remote span context of a W3C traceparent and
// tracestate; it is invalid when traceparent is empty or malformed (a
// malformed trace context never fails a message; it only starts a new
// trace).
func ParseTraceparent(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := traceCarrier{traceparent: traceparent, tracestate: tracestate}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &c))
}

// ContextWithTraceparent returns ctx carrying the remote span context of
// traceparent and tracestate as the parent of spans started from it. ctx is
// returned unchanged when the traceparent is empty or malformed.
func ContextWithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	sc := ParseTraceparent(traceparent, tracestate)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Extract returns ctx carrying e's trace context as the remote parent of
// spans started from it (see [ContextWithTraceparent]).
func Extract(ctx context.Context, e *message.Envelope) context.Context {
	return ContextWithTraceparent(ctx, e.Traceparent, e.Tracestate)
}
