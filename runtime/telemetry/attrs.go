package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/protosaga/saga/runtime/message"
)

// Attribute keys. Semantic-convention keys come from the OpenTelemetry
// semconv package; the saga.* keys are the runtime's own.
const (
	// KeySagaID is the saga instance id (a UUID).
	KeySagaID = attribute.Key("saga.id")
	// KeySagaType is the saga type's full name (sagadef.Definition.Name).
	KeySagaType = attribute.Key("saga.type")
	// KeySagaStep is the step a state or message belongs to.
	KeySagaStep = attribute.Key("saga.step")
	// KeyStepPhase says which command of a step saga.step.latency and
	// saga.step.round_trip measure: PhaseForward (its command) or
	// PhaseCompensation (its compensating command).
	KeyStepPhase = attribute.Key("saga.step.phase")
	// KeyStateFrom and KeyStateTo are the states before and after a
	// transition.
	KeyStateFrom = attribute.Key("saga.state.from")
	KeyStateTo   = attribute.Key("saga.state.to")
	// KeySagaState is a state in gauges.
	KeySagaState = attribute.Key("saga.state")
	// KeySagaClass is the classification of a trigger: new, duplicate,
	// late, conflicting, invalid, early (spans; the saga_audit class).
	KeySagaClass = attribute.Key("saga.class")
	// KeySagaResult is a transition's result in metrics: applied,
	// duplicate, late, conflicting, invalid, early.
	KeySagaResult = attribute.Key("saga.result")
	// KeySagaTrigger is the trigger of a transition: a message full name or
	// a sagadef.Trigger* constant (spans only).
	KeySagaTrigger = attribute.Key("saga.trigger")
	// KeySagaTriggerType is the kind of trigger in metrics: message, start,
	// timeout, deadline, stuck or operator.
	KeySagaTriggerType = attribute.Key("saga.trigger.type")
	// KeySagaVersion is the instance version after a transition.
	KeySagaVersion = attribute.Key("saga.version")
	// KeySagaAttempt is the delivery attempt through the retry tiers (1 =
	// first), or the outbox row's publish attempt on relay spans.
	KeySagaAttempt = attribute.Key("saga.attempt")
	// KeyMessageType is the message's proto full name.
	KeyMessageType = attribute.Key("saga.message.type")
	// KeyCausationID is the id of the message that caused this one.
	KeyCausationID = attribute.Key("saga.causation_id")
	// KeyTimeoutKind is timeout or deadline.
	KeyTimeoutKind = attribute.Key("saga.timeout.kind")
	// KeyOperator is who ran an operator action.
	KeyOperator = attribute.Key("saga.operator")
	// KeyConsumerOutcome is what the consumer did with a delivery:
	// processed, duplicate, retry, park.
	KeyConsumerOutcome = attribute.Key("saga.consumer.outcome")
	// KeyRetryReason says why a delivery was retried.
	KeyRetryReason = attribute.Key("saga.retry.reason")
	// KeyParkClass is permanent or exhausted; KeyParkReason a coarse
	// reason (invalid_envelope, unknown_type, schema_mismatch, undecodable,
	// handler_fault, commit, redelivered, panic, or the handler error's
	// class: permanent, transient, unknown). KeyRetryReason takes the same
	// values where they retry (transient, unknown, panic, commit).
	KeyParkClass  = attribute.Key("saga.park.class")
	KeyParkReason = attribute.Key("saga.park.reason")
)

// Semantic-convention attributes the runtime uses.
var (
	// AttrRabbitMQ is messaging.system=rabbitmq.
	AttrRabbitMQ = semconv.MessagingSystemRabbitMQ
	// AttrPostgreSQL is db.system.name=postgresql.
	AttrPostgreSQL = semconv.DBSystemNamePostgreSQL
	// AttrOpCreate, AttrOpSend and AttrOpProcess are
	// messaging.operation.type values.
	AttrOpCreate  = semconv.MessagingOperationTypeCreate
	AttrOpSend    = semconv.MessagingOperationTypeSend
	AttrOpProcess = semconv.MessagingOperationTypeProcess
)

// Semantic-convention keys the runtime uses.
const (
	KeyDestinationName   = semconv.MessagingDestinationNameKey
	KeyRoutingKey        = semconv.MessagingRabbitMQDestinationRoutingKeyKey
	KeyMessageID         = semconv.MessagingMessageIDKey
	KeyConversationID    = semconv.MessagingMessageConversationIDKey
	KeyConsumerGroup     = semconv.MessagingConsumerGroupNameKey
	KeyOperationName     = semconv.MessagingOperationNameKey
	KeyBodySize          = semconv.MessagingMessageBodySizeKey
	KeyErrorType         = semconv.ErrorTypeKey
	KeyDBCollection      = semconv.DBCollectionNameKey
	KeyDBOperation       = semconv.DBOperationNameKey
	KeyDeliveryTag       = semconv.MessagingRabbitMQMessageDeliveryTagKey
	KeyBatchMessageCount = semconv.MessagingBatchMessageCountKey
)

// Span names (the messaging ones follow "{operation} {destination}").
const (
	SpanCreate      = "create"          // + " " + exchange: a message written to the outbox
	SpanSend        = "send"            // + " " + exchange: the relay's publish
	SpanProcess     = "process"         // + " " + queue: the consumer's handling of a delivery
	SpanStart       = "saga.start"      // + " " + saga type
	SpanTransition  = "saga.transition" // + " " + saga type
	SpanOperate     = "saga.operate"    // + " " + saga type
	SpanParticipant = "participant"     // + " " + command full name
)

// Trigger types (KeySagaTriggerType values).
const (
	TriggerMessage  = "message"
	TriggerStart    = "start"
	TriggerTimeout  = "timeout"
	TriggerDeadline = "deadline"
	TriggerStuck    = "stuck"
	TriggerOperator = "operator"
)

// Step phases (KeyStepPhase values).
const (
	PhaseForward      = "forward"
	PhaseCompensation = "compensation"
)

// KeyValue is attribute.KeyValue, so instrumented packages need not import
// the attribute package for a slice of them.
type KeyValue = attribute.KeyValue

// KeyOriginalExchange is the exchange a consumed message was first
// published to (retry copies arrive through the default exchange).
const KeyOriginalExchange = attribute.Key("saga.exchange")

// MessageAttrs are the identity attributes of a message every span about it
// carries: id, type, conversation (correlation), causation, saga id and type.
func MessageAttrs(e *message.Envelope) []attribute.KeyValue {
	return []attribute.KeyValue{
		KeyMessageID.String(e.MessageID),
		KeyMessageType.String(e.MessageType),
		KeyConversationID.String(e.CorrelationID),
		KeyCausationID.String(e.CausationID),
		KeySagaID.String(e.SagaID),
		KeySagaType.String(e.SagaType),
	}
}
