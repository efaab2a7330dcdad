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
	now     func() time.Time // the engine's clock, which writes updated_at
}

func newSagaTelemetry(p telemetry.Providers, def *sagadef.Definition, now func() time.Time) (sagaTelemetry, error) {
	m, err := telemetry.NewMetrics(p)
	if err != nil {
		return sagaTelemetry{}, err
	}
	t := sagaTelemetry{metrics: m, def: def, now: now}
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

// afterCommit runs record once tx has committed when tx carries the write
// scope of a consumer's handler (or of Engine.InTx, the timeout scanner) —
// so that a batch rolled back and applied again counts its transitions
// once, and a rolled-back one not at all — and at once otherwise (the
// caller owns the transaction).
func afterCommit(ctx context.Context, tx pgx.Tx, record func()) {
	if !txq.AfterCommit(tx, func(context.Context) { record() }) {
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
// sent, an entry into manual review; for the reply a step (or a
// compensation) waited on, the step's round trip; and, for a delivered
// message that made the saga send a command, the step latency (measured
// now, when the transition that sends the command has been applied; its
// rows may still wait for the batch's staged writes).
func (t sagaTelemetry) endTransition(ctx context.Context, tx pgx.Tx, span trace.Span, w row, trig sagadef.Trigger, o origin, out outcome, err error) {
	if err == nil {
		res := out.Result
		rt, measured := t.roundTrip(w, trig, res)
		lat, handled := t.stepLatency(o, res)
		afterCommit(ctx, tx, func() {
			t.metrics.Transition(ctx, t.def, trig.Kind, w.State, res)
			if measured {
				t.metrics.StepRoundTrip(ctx, t.def.Name, rt.step, rt.phase, rt.d)
			}
			if handled {
				t.metrics.StepLatency(ctx, t.def.Name, lat.step, lat.phase, lat.d)
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

// roundTrip is one sample of saga.step.round_trip or saga.step.latency.
type roundTrip struct {
	step, phase string
	d           time.Duration
}

// stepLatency measures PRODUCT's step latency ("reply in → next command
// out") when a delivered message (o.ReceivedAt set) made the saga send a
// command: from the delivery taken from the broker to now, labelled with
// the step and phase of the first command sent.
func (t sagaTelemetry) stepLatency(o origin, res sagadef.Result) (roundTrip, bool) {
	if o.ReceivedAt.IsZero() || len(res.Emit) == 0 || !t.metrics.Enabled() {
		return roundTrip{}, false
	}
	info := res.Emit[0].Message.SagaMessageInfo()
	if info == nil {
		return roundTrip{}, false
	}
	ref, ok := t.def.Lookup(info.FullName)
	if !ok {
		return roundTrip{}, false
	}
	phase := telemetry.PhaseForward
	if ref.Use == sagadef.UseCompensation {
		phase = telemetry.PhaseCompensation
	}
	return roundTrip{step: ref.Step, phase: phase, d: time.Since(o.ReceivedAt)}, true
}

// roundTrip measures the round trip of the command the row w waited on,
// when trig is the reply to it (success or failure; the step's outcome for
// an external step) and res applied it: from the command written to the
// outbox to the reply applied. The command was written by the transition
// that entered the waiting state, and nothing else changes the row while
// it waits (a resend after a timeout or an operator's retry re-enters it
// with a new command; a deferred timeout does not touch updated_at), so
// the row's updated_at is when the command the reply answers was written.
// Only a reply classified new answers that command: a late reply applied
// under the apply-if-waiting policy answers an earlier one, whose sending
// time is gone, and is not measured.
func (t sagaTelemetry) roundTrip(w row, trig sagadef.Trigger, res sagadef.Result) (roundTrip, bool) {
	if !t.metrics.Enabled() || res.Class != sagadef.ClassNew || trig.Message == nil {
		return roundTrip{}, false
	}
	ref, ok := t.def.Lookup(trig.Kind)
	if !ok {
		return roundTrip{}, false
	}
	var waiting, phase string
	switch ref.Use {
	case sagadef.UseSuccess, sagadef.UseFailure:
		waiting, phase = sagadef.StateName(ref.Step), telemetry.PhaseForward
	case sagadef.UseCompensationReply, sagadef.UseCompensationFailure:
		waiting, phase = sagadef.CompensatingStateName(ref.Step), telemetry.PhaseCompensation
	default:
		return roundTrip{}, false
	}
	if w.State != waiting {
		return roundTrip{}, false
	}
	return roundTrip{step: ref.Step, phase: phase, d: t.now().Sub(w.UpdatedAt)}, true
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
