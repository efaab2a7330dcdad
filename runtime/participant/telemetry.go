package participant

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/telemetry"
)

// startSpan starts the "participant COMMAND" span when the context's span
// (the consumer's process span) is recording, from the same
// TracerProvider: the participant needs no configuration of its own.
func startSpan(ctx context.Context, cmd *message.Envelope) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(telemetry.ScopeName).Start(ctx, telemetry.SpanParticipant+" "+cmd.MessageType,
		trace.WithAttributes(telemetry.MessageAttrs(cmd)...))
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
