package consumer

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/telemetry"
)

// consumerTelemetry is a consumer's instrumentation; with zero Providers it
// records nothing and starts no spans.
type consumerTelemetry struct {
	tracer  trace.Tracer // nil: no spans
	metrics *telemetry.Metrics
	labels  telemetry.ConsumerLabels
	name    string
	queue   string
}

func newConsumerTelemetry(cfg *Config) (consumerTelemetry, error) {
	m, err := telemetry.NewMetrics(cfg.Telemetry)
	if err != nil {
		return consumerTelemetry{}, err
	}
	t := consumerTelemetry{metrics: m, name: cfg.Name, queue: cfg.Queue}
	if m.Enabled() {
		t.labels = telemetry.ConsumerAttributes(cfg.Name, cfg.Queue)
	}
	if cfg.Telemetry.TracingEnabled() {
		t.tracer = cfg.Telemetry.RuntimeTracer()
	}
	return t, nil
}

// begin gives every item of a batch the context its handler runs in: the
// message's identity for logs and, with tracing, a "process QUEUE" consumer
// span that continues the trace context the message carries. count counts
// the items as consumed (not again when a batch is applied once more one
// delivery at a time).
func (t consumerTelemetry) begin(ctx context.Context, items []*item, count bool) {
	if count {
		t.metrics.Consumed(ctx, t.labels, len(items))
	}
	for _, it := range items {
		it.ctx = ctx
		if it.d != nil {
			it.ctx = telemetry.ContextWithMessage(ctx, &it.d.Envelope)
		}
		if t.tracer == nil {
			continue
		}
		raw := it.raw
		var pctx context.Context
		if it.d != nil {
			pctx = telemetry.Extract(it.ctx, &it.d.Envelope)
		} else {
			tp, _, _ := message.HeaderString(raw.Headers, message.HeaderTraceparent)
			ts, _, _ := message.HeaderString(raw.Headers, message.HeaderTracestate)
			pctx = telemetry.ContextWithTraceparent(it.ctx, tp, ts)
		}
		exchange, routingKey := routing(raw)
		attrs := []telemetry.KeyValue{
			telemetry.AttrRabbitMQ, telemetry.AttrOpProcess,
			telemetry.KeyOperationName.String("process"),
			telemetry.KeyDestinationName.String(t.queue),
			telemetry.KeyConsumerGroup.String(t.name),
			telemetry.KeyRoutingKey.String(routingKey),
			telemetry.KeyOriginalExchange.String(exchange),
			telemetry.KeyMessageID.String(raw.MessageId),
			telemetry.KeyConversationID.String(raw.CorrelationId),
			telemetry.KeyMessageType.String(raw.Type),
			telemetry.KeySagaAttempt.Int(it.attempt),
			telemetry.KeyBodySize.Int(len(raw.Body)),
			telemetry.KeyDeliveryTag.Int(int(raw.DeliveryTag)),
		}
		if it.d != nil {
			e := &it.d.Envelope
			attrs = append(attrs, telemetry.KeyCausationID.String(e.CausationID),
				telemetry.KeySagaID.String(e.SagaID), telemetry.KeySagaType.String(e.SagaType))
		}
		it.ctx, it.span = t.tracer.Start(pctx, telemetry.SpanProcess+" "+t.queue,
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	}
}

// rolledBack follows a fast-path attempt that rolled back (see
// transactFast): each delivery whose handler ran in it and that is applied
// again gets a new process span, and its first one ends with
// saga.consumer.outcome=rolled_back. The spans its handler started in the
// attempt (a transition, an outbox row's create span) ended looking
// successful, but nothing they did committed: they are the children of
// the rolled-back span, and what commits is under the new one.
func (t consumerTelemetry) rolledBack(ctx context.Context, items []*item) {
	var again []*item
	for _, it := range items {
		if it.ranFast && it.outcome == outcomePending && it.span != nil {
			again = append(again, it)
		}
		it.ranFast = false
	}
	if len(again) == 0 {
		return
	}
	for _, it := range again {
		it.span.SetAttributes(telemetry.KeyConsumerOutcome.String(outcomeRolledBack))
		it.span.End()
		it.span = nil
	}
	t.begin(ctx, again, false)
}

// outcomeRolledBack is the saga.consumer.outcome of a process span whose
// work was rolled back and applied again under another one.
const outcomeRolledBack = "rolled_back"

// end ends the spans of a batch's items. failed is the error that left
// some of them unacknowledged (nil when the batch was settled).
func (t consumerTelemetry) end(items []*item, failed error) {
	if t.tracer == nil {
		return
	}
	for _, it := range items {
		if it.span == nil {
			continue
		}
		name := outcomeName(it.outcome)
		if !it.acked && failed == nil {
			// The batch was applied again one delivery at a time: the
			// delivery's own process span follows.
			name = "split"
		}
		it.span.SetAttributes(telemetry.KeyConsumerOutcome.String(name))
		switch {
		case !it.acked && failed != nil:
			it.span.RecordError(failed)
			it.span.SetStatus(codes.Error, "not acknowledged; will be redelivered")
		case !it.acked:
		case it.outcome == outcomeRetry || it.outcome == outcomePark:
			it.span.RecordError(it.err)
			it.span.SetStatus(codes.Error, it.err.Error())
			if it.outcome == outcomePark {
				it.span.SetAttributes(telemetry.KeyParkClass.String(it.parkClass()), telemetry.KeyParkReason.String(it.failureReason()))
			} else {
				it.span.SetAttributes(telemetry.KeyRetryReason.String(it.failureReason()))
			}
		}
		it.span.End()
		it.span = nil
	}
}

// settled records the metrics of items that were just acknowledged.
func (t consumerTelemetry) settled(ctx context.Context, items []*item, now time.Time) {
	for _, it := range items {
		it.acked = true
	}
	if !t.metrics.Enabled() {
		return
	}
	for _, it := range items {
		switch it.outcome {
		case outcomeRetry:
			t.metrics.Retried(ctx, t.labels, it.failureReason())
		case outcomePark:
			t.metrics.Parked(ctx, t.labels, it.parkClass(), it.failureReason())
		}
		t.metrics.Settled(ctx, t.labels, outcomeName(it.outcome), now.Sub(it.received))
	}
}

// outcomeName is the saga.consumer.outcome of an outcome.
func outcomeName(o outcome) string {
	switch o {
	case outcomeDone:
		return "processed"
	case outcomeDuplicate:
		return "duplicate"
	case outcomeRetry:
		return "retry"
	case outcomePark:
		return "park"
	default:
		return "pending"
	}
}

// failureReason is the coarse reason an item was retried or parked: set
// where decoding or the transaction failed, else the handler error's class
// (transient, unknown, permanent) or panic.
func (it *item) failureReason() string {
	if it.reason != "" {
		return it.reason
	}
	if it.err != nil && strings.HasPrefix(it.err.Error(), "handler: panic: ") {
		return "panic"
	}
	return it.class.String()
}

// handlerContext is the context the handler of it runs in.
func (it *item) handlerContext(ctx context.Context) context.Context {
	if it.ctx != nil {
		return it.ctx
	}
	return ctx
}
