package message

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"google.golang.org/protobuf/proto"
)

// HeaderOccurredAt carries OccurredAt with nanosecond precision (RFC 3339).
// The AMQP Timestamp property carries it too, but only to the second.
const HeaderOccurredAt = "x-occurred-at"

// ErrInvalidMetadata is matched (with errors.Is) by every error FromDelivery
// and New return for missing or malformed metadata. Such a message can never
// become valid by retrying: consumers park it.
var ErrInvalidMetadata = errors.New("invalid envelope metadata")

// MetadataError reports one missing or malformed metadata field.
type MetadataError struct {
	// Field names the property or header, e.g. "message id" or
	// HeaderSchemaVersion.
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *MetadataError) Error() string {
	return fmt.Sprintf("envelope %s: %s", e.Field, e.Reason)
}

// Is makes every MetadataError match ErrInvalidMetadata.
func (e *MetadataError) Is(target error) bool { return target == ErrInvalidMetadata }

// Meta is the caller-supplied metadata of a new envelope. Every field is
// optional.
type Meta struct {
	// MessageID defaults to a new UUIDv7 (time-ordered).
	MessageID string
	// CorrelationID defaults to SagaID, then to the message id: every
	// message carries a correlation id.
	CorrelationID string
	// CausationID is the id of the message that caused this one.
	CausationID string
	// SagaID and SagaType name the saga the message belongs to.
	SagaID, SagaType string
	// Traceparent and Tracestate are the W3C trace context.
	Traceparent, Tracestate string
	// OccurredAt defaults to the current time in UTC.
	OccurredAt time.Time
}

// New wraps m in an envelope: the body is m's deterministic protobuf
// encoding; type, schema version, exchange, routing key and idempotency key
// come from m's generated Info.
func New(m Message, meta Meta) (Envelope, error) {
	if m == nil {
		return Envelope{}, errors.New("new envelope: nil message")
	}
	info := m.SagaMessageInfo()
	if info == nil || info.FullName == "" {
		return Envelope{}, fmt.Errorf("new envelope for %T: message has no info", m)
	}
	if info.SchemaVersion < 1 {
		return Envelope{}, fmt.Errorf("new envelope for %s: schema version %d, want at least 1", info.FullName, info.SchemaVersion)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return Envelope{}, fmt.Errorf("new envelope for %s: marshal body: %w", info.FullName, err)
	}
	if meta.MessageID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return Envelope{}, fmt.Errorf("new envelope for %s: message id: %w", info.FullName, err)
		}
		meta.MessageID = id.String()
	}
	if meta.CorrelationID == "" {
		meta.CorrelationID = meta.SagaID
	}
	if meta.CorrelationID == "" {
		meta.CorrelationID = meta.MessageID
	}
	if meta.OccurredAt.IsZero() {
		meta.OccurredAt = time.Now()
	}
	if body == nil {
		body = []byte{} // an empty message is a valid, empty body
	}
	env := Envelope{
		MessageID:      meta.MessageID,
		CorrelationID:  meta.CorrelationID,
		CausationID:    meta.CausationID,
		SagaID:         meta.SagaID,
		SagaType:       meta.SagaType,
		MessageType:    info.FullName,
		SchemaVersion:  info.SchemaVersion,
		IdempotencyKey: m.IdempotencyKey(),
		OccurredAt:     meta.OccurredAt.UTC(),
		Traceparent:    meta.Traceparent,
		Tracestate:     meta.Tracestate,
		Exchange:       info.Exchange,
		RoutingKey:     info.RoutingKey,
		Body:           body,
	}
	if info.TimeToBeReceived > 0 {
		SetExpiry(&env, env.OccurredAt.Add(info.TimeToBeReceived))
	}
	return env, nil
}

// Publishing maps e onto an AMQP message: MessageId, CorrelationId, Type,
// Timestamp, ContentType and persistent DeliveryMode as properties; schema
// version, saga id and type, causation id, idempotency key, occurred-at and
// trace context as headers (empty strings are omitted). Extra Headers are
// copied first, so an extra header can never override an envelope field.
// Header values AMQP cannot carry are converted (nested maps to tables,
// other types to their fmt representation), so Publishing never produces a
// message the client library refuses.
func (e *Envelope) Publishing() amqp.Publishing {
	h := make(amqp.Table, len(e.Headers)+8)
	for k, v := range e.Headers {
		h[k] = headerValue(v)
	}
	for _, k := range reservedHeaders {
		delete(h, k)
	}
	h[HeaderSchemaVersion] = e.SchemaVersion
	setString := func(k, v string) {
		if v != "" {
			h[k] = v
		}
	}
	setString(HeaderSagaID, e.SagaID)
	setString(HeaderSagaType, e.SagaType)
	setString(HeaderCausationID, e.CausationID)
	setString(HeaderIdempotency, e.IdempotencyKey)
	setString(HeaderTraceparent, e.Traceparent)
	setString(HeaderTracestate, e.Tracestate)
	if !e.OccurredAt.IsZero() {
		h[HeaderOccurredAt] = e.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	return amqp.Publishing{
		Headers:       h,
		ContentType:   ContentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: e.CorrelationID,
		MessageId:     e.MessageID,
		Timestamp:     e.OccurredAt.UTC(),
		Type:          e.MessageType,
		Body:          e.Body,
	}
}

// reservedHeaders are the headers that map onto Envelope fields.
var reservedHeaders = [...]string{
	HeaderSchemaVersion, HeaderSagaID, HeaderSagaType, HeaderCausationID,
	HeaderIdempotency, HeaderTraceparent, HeaderTracestate, HeaderOccurredAt,
}

// FromDelivery reads the envelope of a delivery. Message id, type and schema
// version are required; a malformed optional header is an error too, since
// it means the sender is broken. Every problem is reported (joined), each as
// a *MetadataError matching ErrInvalidMetadata. Exchange and RoutingKey are
// the delivery's; Headers holds every header that is not an envelope field
// (retry, park and broker headers such as x-death). Body is shared with d.
func FromDelivery(d *amqp.Delivery) (Envelope, error) {
	if d == nil {
		return Envelope{}, &MetadataError{Field: "delivery", Reason: "nil"}
	}
	var errs []error
	bad := func(field, reason string) { errs = append(errs, &MetadataError{Field: field, Reason: reason}) }
	e := Envelope{
		MessageID:     d.MessageId,
		CorrelationID: d.CorrelationId,
		MessageType:   d.Type,
		Exchange:      d.Exchange,
		RoutingKey:    d.RoutingKey,
		Body:          d.Body,
	}
	if e.MessageID == "" {
		bad("message id", "missing")
	}
	if e.MessageType == "" {
		bad("type", "missing")
	}
	switch v, ok, err := HeaderInt(d.Headers, HeaderSchemaVersion); {
	case err != nil:
		bad(HeaderSchemaVersion, err.Error())
	case !ok:
		bad(HeaderSchemaVersion, "missing")
	case v < 1 || v > 1<<31-1:
		bad(HeaderSchemaVersion, fmt.Sprintf("%d is out of range [1, 2147483647]", v))
	default:
		e.SchemaVersion = int32(v)
	}
	for _, f := range []struct {
		key string
		dst *string
	}{
		{HeaderSagaID, &e.SagaID},
		{HeaderSagaType, &e.SagaType},
		{HeaderCausationID, &e.CausationID},
		{HeaderIdempotency, &e.IdempotencyKey},
		{HeaderTraceparent, &e.Traceparent},
		{HeaderTracestate, &e.Tracestate},
	} {
		s, _, err := HeaderString(d.Headers, f.key)
		if err != nil {
			bad(f.key, err.Error())
		}
		*f.dst = s
	}
	switch t, ok, err := HeaderTime(d.Headers, HeaderOccurredAt); {
	case err != nil:
		bad(HeaderOccurredAt, err.Error())
	case ok:
		e.OccurredAt = t
	case !d.Timestamp.IsZero():
		e.OccurredAt = d.Timestamp.UTC()
	}
	if len(d.Headers) > 0 {
		rest := maps.Clone(map[string]any(d.Headers))
		for _, k := range reservedHeaders {
			delete(rest, k)
		}
		if len(rest) > 0 {
			e.Headers = rest
		}
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		if e.MessageID != "" {
			return e, fmt.Errorf("message %s: %w", e.MessageID, err)
		}
		return e, err
	}
	return e, nil
}

// headerValue converts v into a value amqp.Table accepts.
func headerValue(v any) any {
	switch v := v.(type) {
	case nil, bool, byte, int8, int, int16, int32, int64, uint16, uint32, float32, float64,
		string, []byte, amqp.Decimal, time.Time:
		return v
	case uint64:
		if v <= 1<<63-1 {
			return int64(v)
		}
		return fmt.Sprint(v)
	case uint:
		if uint64(v) <= 1<<63-1 {
			return int64(v)
		}
		return fmt.Sprint(v)
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		if f, err := v.Float64(); err == nil {
			return f
		}
		return v.String()
	case amqp.Table:
		t := make(amqp.Table, len(v))
		for k, x := range v {
			t[k] = headerValue(x)
		}
		return t
	case map[string]any:
		t := make(amqp.Table, len(v))
		for k, x := range v {
			t[k] = headerValue(x)
		}
		return t
	case []any:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = headerValue(x)
		}
		return a
	case []string:
		a := make([]any, len(v))
		for i, x := range v {
			a[i] = x
		}
		return a
	case fmt.Stringer:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}
