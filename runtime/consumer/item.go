package consumer

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
)

// outcome is what happens to one delivery of a batch.
type outcome int

// String returns the outcome's name, as tests and logs see it.
func (o outcome) String() string {
	switch o {
	case outcomeDone:
		return "done"
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

// item is one delivery on its way through a batch.
type item struct {
	raw     *amqp.Delivery
	d       *Delivery // nil when the delivery could not be decoded
	attempt int
	outcome outcome
	err     error         // the failure being routed (outcomeRetry, outcomePark)
	class   retry.Class   // err's class
	tier    time.Duration // the retry delay (outcomeRetry)
	parkID  string        // the parked copy's message id (outcomePark)

	// redeliveries is the broker's count of earlier unacknowledged
	// deliveries (x-delivery-count). suspect: at MaxRedeliveries or more,
	// handled alone with a saga_consumer_suspect row; stoppedBefore: that
	// row was already there, so the handler is not run and it is parked.
	redeliveries           int
	suspect, stoppedBefore bool
	// failedBefore, set with stoppedBefore, is the error its last handlings
	// kept failing with, when the consumer saw them fail rather than stop
	// (see interruptedSet).
	failedBefore string

	// ranFast is set when the handler ran in a fast-path attempt (see
	// consumerTelemetry.rolledBack).
	ranFast bool

	received time.Time       // when the worker took the delivery
	reason   string          // coarse failure reason for metrics; "" = by class
	ctx      context.Context // the handler's context (identity, span); nil = the batch's
	span     trace.Span      // the delivery's process span (tracing only)
	acked    bool            // acknowledged
}

// messageID returns the delivery's message id (possibly empty).
func (it *item) messageID() string { return it.raw.MessageId }

// fail routes it by the class of err: permanent failures park; the others
// retry while the policy allows, then park.
func (it *item) fail(err error, p retry.Policy) {
	it.err = err
	it.class = retry.ClassOf(err)
	if it.class != retry.ClassPermanent {
		if ttl, ok := p.TierFor(it.attempt); ok {
			it.outcome, it.tier = outcomeRetry, ttl
			return
		}
	}
	it.outcome = outcomePark
}

// parkClass is the saga_parked.class and HeaderParkClass value.
func (it *item) parkClass() string {
	if it.class == retry.ClassPermanent {
		return "permanent"
	}
	return "exhausted"
}

// decode reads the envelope, checks type and schema version, and decodes the
// body. Every failure here is permanent: the same bytes never decode later.
func (c *Consumer) decode(raw *amqp.Delivery) *item {
	it := &item{raw: raw, attempt: attemptOf(raw.Headers), redeliveries: c.redeliveriesOf(raw), received: c.now()}
	env, err := message.FromDelivery(raw)
	if err != nil {
		it.reason = "invalid_envelope"
		it.fail(retry.Permanent(fmt.Errorf("invalid envelope: %w", err)), c.cfg.Retry)
		return it
	}
	if !utf8.ValidString(env.MessageID) || strings.ContainsRune(env.MessageID, 0) {
		// The inbox could never store it: every claim would fail.
		it.reason = "invalid_envelope"
		it.fail(retry.Permanent(fmt.Errorf("invalid envelope: message id %q is not valid UTF-8 text", env.MessageID)), c.cfg.Retry)
		return it
	}
	info, ok := c.cfg.Registry.Lookup(env.MessageType)
	if !ok {
		it.reason = "unknown_type"
		it.fail(retry.Permanent(fmt.Errorf("unknown message type %q", env.MessageType)), c.cfg.Retry)
		return it
	}
	if env.SchemaVersion > info.SchemaVersion {
		it.reason = "schema_mismatch"
		it.fail(retry.Permanent(fmt.Errorf("schema version mismatch: %s version %d is newer than this consumer's version %d",
			env.MessageType, env.SchemaVersion, info.SchemaVersion)), c.cfg.Retry)
		return it
	}
	msg, err := c.cfg.Registry.Decode(env.MessageType, env.Body)
	if err != nil {
		it.reason = "undecodable"
		it.fail(retry.Permanent(fmt.Errorf("undecodable body: %w", err)), c.cfg.Retry)
		return it
	}
	if err := expired(&env, it.received); err != nil { // parked unhandled: see expiry.go
		it.reason = "expired"
		it.fail(retry.Permanent(err), c.cfg.Retry)
		return it
	}
	it.d = &Delivery{Envelope: env, Message: msg, Queue: c.cfg.Queue, Attempt: it.attempt, ReceivedAt: it.received}
	if c.cfg.HandlerDedupes {
		it.d.Unclaimed = c.cfg.Name
	}
	return it
}
