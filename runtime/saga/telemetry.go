package saga

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// sagaTelemetry is an engine's instrumentation; with zero Providers it
// records nothing and starts no spans.
type sagaTelemetry struct {
	tracer  trace.Tracer // nil: no spans
	metrics *telemetry.Metrics
	def     *sagadef.Definition
}

func newSagaTelemetry(p telemetry.Providers, def *sagadef.Definition) (sagaTelemetry, error) {
	m, err := telemetry.NewMetrics(p)
	if err != nil {
		return sagaTelemetry{}, err
	}
	t := sagaTelemetry{metrics: m, def: def}
	if p.TracingEnabled() {
		t.tracer = p.RuntimeTracer()
	}
	return t, nil
}

// startStart starts the span of StartTx, a child of the caller's span. The
// first commands' outbox rows become its children.
func (t sagaTelemetry) startStart(ctx context.Context, meta messageMeta) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, nil
	}
	return t.tracer.Start(ctx, telemetry.SpanStart+" "+t.def.Name, trace.WithAttributes(
		telemetry.KeySagaType.String(t.def.Name),
		telemetry.KeySagaTrigger.String(sagadef.TriggerStart),
		telemetry.KeyMessageID.String(meta.messageID),
		telemetry.KeyCausationID.String(meta.causationID),
	))
}

// afterCommit runs record once tx has committed when ctx carries the write
// scope of a consumer's handler for tx — so that a batch rolled back and
// applied again counts its transitions once, and a rolled-back one not at
// all — and at once otherwise (the caller owns the transaction).
func afterCommit(ctx context.Context, tx pgx.Tx, record func()) {
	if !txq.AfterCommit(ctx, tx, func(context.Context) { record() }) {
		record()
	}
}

// endStart ends the start span and counts the start (see afterCommit).
func (t sagaTelemetry) endStart(ctx context.Context, tx pgx.Tx, span trace.Span, sagaID string, created bool, state string, err error) {
	if err == nil {
		class := sagadef.ClassNew
		if !created {
			class = sagadef.ClassDuplicate
		}
		afterCommit(ctx, tx, func() {
			t.metrics.Transition(ctx, t.def, sagadef.TriggerStart, "", sagadef.Result{Class: class})
		})
		if span != nil {
			span.SetAttributes(telemetry.KeySagaID.String(sagaID), telemetry.KeySagaClass.String(class.String()),
				telemetry.KeyStateTo.String(state))
		}
	}
	endSpan(span, err)
}

// messageMeta is the identity of a start message.
type messageMeta struct{ messageID, causationID string }

// startTransition starts the span of one trigger applied to the instance in
// row w: a child of the delivery's process span for messages, a new trace
// for timeouts, the caller's span for operator actions.
func (t sagaTelemetry) startTransition(ctx context.Context, name string, w row, trig sagadef.Trigger, o origin) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(
		telemetry.KeySagaID.String(w.ID),
		telemetry.KeySagaType.String(t.def.Name),
		telemetry.KeySagaStep.String(telemetry.StepOf(t.def, w.State)),
		telemetry.KeyStateFrom.String(w.State),
		telemetry.KeySagaTrigger.String(trig.Kind),
		telemetry.KeyMessageID.String(trig.MessageID),
		telemetry.KeyConversationID.String(w.ID),
		telemetry.KeyCausationID.String(trig.CausationID),
		telemetry.KeySagaAttempt.Int(o.Attempt),
	)}
	if o.Link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: o.Link}))
	}
	return t.tracer.Start(ctx, name+" "+t.def.Name, opts...)
}

// endTransition ends the transition span and records the transition's
// metrics (see afterCommit): its result, a fired timeout, compensations
// sent, an entry into manual review and, for a delivered message that sent
// the next command, the step latency (measured now, when the transition
// that sends the command has been applied; its rows may still wait for the
// batch's staged writes).
func (t sagaTelemetry) endTransition(ctx context.Context, tx pgx.Tx, span trace.Span, w row, trig sagadef.Trigger, o origin, out outcome, err error) {
	if err == nil {
		res := out.Result
		step, latency := "", time.Duration(0)
		if !o.ReceivedAt.IsZero() && len(res.Emit) > 0 && t.metrics.Enabled() {
			if info := res.Emit[0].Message.SagaMessageInfo(); info != nil {
				if ref, ok := t.def.Lookup(info.FullName); ok {
					step, latency = ref.Step, time.Since(o.ReceivedAt)
				}
			}
		}
		afterCommit(ctx, tx, func() {
			t.metrics.Transition(ctx, t.def, trig.Kind, w.State, res)
			if step != "" {
				t.metrics.StepLatency(ctx, t.def.Name, step, latency)
			}
		})
		if span != nil {
			to := res.To
			if to == "" {
				to = res.Instance.State
			}
			span.SetAttributes(
				telemetry.KeyStateTo.String(to),
				telemetry.KeySagaClass.String(res.Class.String()),
				telemetry.KeySagaVersion.Int64(out.Version),
			)
		}
	}
	endSpan(span, err)
}

// endSpan ends span (if any), recording err.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// withOperator records who ran an operator action on its span.
func withOperator(span trace.Span, operator string) trace.Span {
	if span != nil {
		span.SetAttributes(telemetry.KeyOperator.String(operator))
	}
	return span
}
