// Package telemetry makes the runtime observable with OpenTelemetry traces and
// metrics and structured log/slog logs, without global state: every runtime
// component takes a [Providers] value in its Config (saga.Config.Telemetry,
// consumer.Config.Telemetry, outbox.RelayConfig.Telemetry), and the zero
// value turns instrumentation off.
//
// # One trace per business operation
//
// The W3C trace context travels with every message: in the saga_outbox row
// (traceparent, tracestate columns), in the AMQP headers of the same names,
// and in message.Envelope. The chain of spans is
//
//	saga.start TYPE                        (Engine.StartTx, child of the caller's span)
//	└ create EXCHANGE   [producer]         (outbox.Enqueue, one per message; its context is the row's traceparent)
//	  ├ send EXCHANGE   [producer]         (Relay, child of the row's traceparent; publishes that traceparent unchanged)
//	  └ process QUEUE   [consumer]         (Consumer, child of the envelope's traceparent)
//	    ├ participant COMMAND              (participant.Handler)
//	    │ └ create EXCHANGE                (the reply's outbox row) ...
//	    └ saga.transition TYPE             (Engine.Handle / timeouts / operator actions)
//	      └ create EXCHANGE                (the next command's outbox row) ...
//
// so a trace covers start → outbox → relay → broker → consume → transition →
// next command across any number of processes. The relay's publish span and
// the consumer's process span are siblings under the message's create span:
// the message carries the context it was created in, not the context of
// whichever relay happened to publish it, so a republished message (after a
// nack or a relay crash) keeps its place in the trace.
//
// outbox.Enqueue is a plain function without a Config: it takes the tracer
// from the span in its context (trace.Span.TracerProvider), so a create span
// exists exactly when the caller's span is recording, and the row's
// traceparent is the current span's context whenever there is one (the
// envelope's own Traceparent otherwise, so a process without tracing still
// passes the context through).
//
// # Metrics
//
// [Metrics] defines every instrument (names follow the OpenTelemetry
// semantic conventions where one exists: messaging.client.sent.messages,
// messaging.client.consumed.messages, messaging.process.duration; the rest
// are saga.*). The observable gauges that read the database at collection
// time are registered by the packages that own the tables they read, with
// this package's names and [GaugeOption]s: saga.RegisterGauges (instances by
// type and state, stuck instances) and outbox.RegisterGauges (outbox
// backlog, age of the oldest unpublished row, parked messages). Package promexport builds a MeterProvider with a
// Prometheus endpoint on a private registry (mount its MetricsHandler at
// /metrics); this package itself depends on the OpenTelemetry API only. docs/observability.md lists every span, attribute, metric and
// log field.
//
// # Logs
//
// [NewLogHandler] wraps any slog.Handler: it adds trace_id and span_id and
// the message identity of the delivery being handled (saga_id, message_id,
// correlation_id, causation_id; see [ContextWithMessage]) to every record
// logged with a context, and redacts sensitive attributes (by key) and
// message bodies (byte slices and protobuf messages are never written).
//
// # Cost
//
// With zero Providers the components skip instrumentation behind a nil check:
// no spans, no attribute sets, no allocations. The measured overhead of
// enabled instrumentation is in docs/observability.md.
package telemetry
