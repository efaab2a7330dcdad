package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
)

// Log field names: every runtime log record that concerns a message or a
// saga uses these keys.
const (
	LogSagaID        = "saga_id"
	LogSagaType      = "saga_type"
	LogMessageID     = "message_id"
	LogMessageType   = "message_type"
	LogCorrelationID = "correlation_id"
	LogCausationID   = "causation_id"
	LogTraceID       = "trace_id"
	LogSpanID        = "span_id"
)

// Redacted replaces the value of a sensitive attribute.
const Redacted = "[REDACTED]"

// DefaultSensitiveKeys are attribute keys (compared case-insensitively,
// also as a suffix after "_" or ".", e.g. "user_password") whose values
// [NewLogHandler] never writes.
var DefaultSensitiveKeys = []string{
	"password", "passwd", "secret", "token", "authorization", "api_key", "apikey",
	"cookie", "credential", "credentials", "private_key", "body", "payload",
	"card_number", "cvv", "iban", "ssn",
}

// messageIDs is the identity of the message being handled.
type messageIDs struct {
	sagaID, sagaType, messageID, messageType, correlationID, causationID string
}

type messageKey struct{}

// ContextWithMessage returns ctx carrying e's identity (saga id and type,
// message id and type, correlation and causation ids), which a
// [NewLogHandler] handler adds to every record logged with the context. The
// consumer does this for every delivery it hands to a handler.
func ContextWithMessage(ctx context.Context, e *message.Envelope) context.Context {
	return context.WithValue(ctx, messageKey{}, messageIDs{
		sagaID: e.SagaID, sagaType: e.SagaType, messageID: e.MessageID, messageType: e.MessageType,
		correlationID: e.CorrelationID, causationID: e.CausationID,
	})
}

// LogOptions configure [NewLogHandler].
type LogOptions struct {
	// SensitiveKeys replaces DefaultSensitiveKeys when not nil.
	SensitiveKeys []string
}

// NewLogHandler wraps next so that every record
//
//   - logged with a context carrying a span gets trace_id and span_id;
//   - logged with a context from [ContextWithMessage] gets saga_id,
//     saga_type, message_id, message_type, correlation_id and causation_id
//     (those the record does not already carry, and only when non-empty);
//   - never carries a sensitive value: attributes whose key is sensitive
//     (see DefaultSensitiveKeys) are replaced by [Redacted], byte slices by
//     their length and protobuf messages by their type name, in groups too,
//     so message bodies are never logged.
func NewLogHandler(next slog.Handler, opts LogOptions) slog.Handler {
	keys := opts.SensitiveKeys
	if keys == nil {
		keys = DefaultSensitiveKeys
	}
	set := make(map[string]bool, len(keys))
	for _, k := range keys {
		set[strings.ToLower(k)] = true
	}
	return &logHandler{next: next, sensitive: set}
}

type logHandler struct {
	next      slog.Handler
	sensitive map[string]bool
	// preset are keys already added through WithAttrs, so the context ids
	// do not repeat them.
	preset map[string]bool
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	present := make(map[string]bool, r.NumAttrs()+len(h.preset))
	for k := range h.preset {
		present[k] = true
	}
	r.Attrs(func(a slog.Attr) bool {
		present[a.Key] = true
		out.AddAttrs(h.clean(a))
		return true
	})
	add := func(k, v string) {
		if v != "" && !present[k] {
			out.AddAttrs(slog.String(k, v))
		}
	}
	if ctx != nil {
		if ids, ok := ctx.Value(messageKey{}).(messageIDs); ok {
			add(LogSagaID, ids.sagaID)
			add(LogSagaType, ids.sagaType)
			add(LogMessageID, ids.messageID)
			add(LogMessageType, ids.messageType)
			add(LogCorrelationID, ids.correlationID)
			add(LogCausationID, ids.causationID)
		}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			add(LogTraceID, sc.TraceID().String())
			add(LogSpanID, sc.SpanID().String())
		}
	}
	return h.next.Handle(ctx, out)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	preset := make(map[string]bool, len(h.preset)+len(attrs))
	for k := range h.preset {
		preset[k] = true
	}
	for i, a := range attrs {
		clean[i] = h.clean(a)
		preset[a.Key] = true
	}
	return &logHandler{next: h.next.WithAttrs(clean), sensitive: h.sensitive, preset: preset}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{next: h.next.WithGroup(name), sensitive: h.sensitive, preset: h.preset}
}

// isSensitive reports whether key, or its last "_"/"."-separated part, is
// sensitive.
func (h *logHandler) isSensitive(key string) bool {
	k := strings.ToLower(key)
	if h.sensitive[k] {
		return true
	}
	for s := range h.sensitive {
		if strings.HasSuffix(k, "_"+s) || strings.HasSuffix(k, "."+s) {
			return true
		}
	}
	return false
}

// clean redacts a.
func (h *logHandler) clean(a slog.Attr) slog.Attr {
	if h.isSensitive(a.Key) {
		return slog.String(a.Key, Redacted)
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, x := range g {
			out[i] = h.clean(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case []byte:
			return slog.String(a.Key, fmt.Sprintf("[%d bytes]", len(x)))
		case proto.Message:
			return slog.String(a.Key, "[message "+string(x.ProtoReflect().Descriptor().FullName())+"]")
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
