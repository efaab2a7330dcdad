package message

import "time"

// AMQP header names. They are part of the wire contract: never rename one.
const (
	HeaderSagaID        = "x-saga-id"
	HeaderSagaType      = "x-saga-type"
	HeaderCausationID   = "x-causation-id"
	HeaderSchemaVersion = "x-schema-version"
	HeaderTraceparent   = "traceparent"
	HeaderTracestate    = "tracestate"
	HeaderIdempotency   = "x-idempotency-key"
	// HeaderAttempt counts deliveries through the retry tiers (1 = first).
	HeaderAttempt = "x-attempt"
	// HeaderOperatorRetry is on a command an operator retried (or
	// compensated again) after its step or compensation recorded a
	// failure: how many times that happened (1, 2, ...).
	// An idempotent participant (participant.Idempotent) then runs the
	// command again rather than answer with the failure it stored.
	HeaderOperatorRetry = "x-saga-operator-retry"
	// HeaderCompensates is on a compensating command the saga sent for a
	// step that stopped waiting without an answer (a timeout, an operator's
	// compensate): the once key (OnceKey) of the command it undoes,
	// which may not have run yet. An idempotent participant records that
	// key as done, so the command, arriving after its compensation, has no
	// effect.
	HeaderCompensates = "x-saga-compensates"
	// HeaderOnce is on a reply from a participant that runs each command
	// once per idempotency key and records a command as done when its
	// compensation comes first (participant.Idempotent, as every
	// host-registered participant): its value is the service. A success
	// from such a participant that arrives after the step's compensation
	// was sent had its effect in place before the compensation ran, which
	// undid it.
	HeaderOnce = "x-saga-once"
	// HeaderChildReview, on a child saga's manual-review reply to its
	// parent, names the child instance and why it is in review.
	HeaderChildReview = "x-saga-child-review"
	// Parking-lot headers: why a message was parked and where it came from.
	HeaderParkReason     = "x-park-reason"
	HeaderParkClass      = "x-park-class"
	HeaderOrigExchange   = "x-original-exchange"
	HeaderOrigRoutingKey = "x-original-routing-key"
	HeaderOrigQueue      = "x-original-queue"
	HeaderFirstFailureAt = "x-first-failure-at"
)

// ContentType is the AMQP content type of every body.
const ContentType = "application/x-protobuf"

// Envelope is one message with its metadata. Message type and schema version
// travel in AMQP's Type property and HeaderSchemaVersion; MessageID,
// CorrelationID and Timestamp in the AMQP properties of the same name.
type Envelope struct {
	// MessageID is unique per message (a UUID). A republish keeps it, so
	// consumers dedupe on it.
	MessageID string
	// CorrelationID ties every message of one business operation together;
	// for saga traffic it is the saga id.
	CorrelationID string
	// CausationID is the MessageID of the message that caused this one
	// (empty for a message started by an API call). A reply's CausationID is
	// its command's MessageID.
	CausationID string
	// SagaID and SagaType name the saga instance this message belongs to.
	SagaID   string
	SagaType string
	// MessageType is the proto full name of the body.
	MessageType string
	// SchemaVersion is the contract version of the body's type.
	SchemaVersion int32
	// IdempotencyKey is the business key participants dedupe effects on.
	IdempotencyKey string
	// OccurredAt is when the cause happened (the transaction's clock).
	OccurredAt time.Time
	// Traceparent and Tracestate are the W3C trace context.
	Traceparent string
	Tracestate  string
	// Exchange and RoutingKey say where the message is published.
	Exchange   string
	RoutingKey string
	// Headers holds any further headers (retry and park metadata).
	Headers map[string]any
	// Body is the protobuf binary encoding of the message.
	Body []byte
}
