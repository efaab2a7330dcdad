// Package subscriber is the glue between a consumer and the code of a
// service that reacts to events (choreography): a subscriber.
//
// An event names its subscribing services in the contract
// (subscribers: ["notifications"]). Each service gets a generated
// <Service>Subscriber interface and its own queue
// ("<service>.events.<proto package>") bound to those events, so every
// subscribing service receives its own copy. [Handler] turns a [Func] into
// a [consumer.HandlerFunc] that runs it in the consumer's transaction:
//
//	tx{ inbox claim (consumer, message id) → Func(event) → own writes, outbox rows } → commit → ack
//
// The consumer's inbox is keyed by its name, which is the subscriber's
// queue: each subscribing service handles an event once, a redelivery of
// the same message id is dropped. The subscriber's writes and the messages
// it publishes through the outbox (generated Publish<Msg> with the same tx,
// and [Meta] to continue the event's conversation) commit together with
// the claim. A returned error rolls all of it back and the consumer's
// failure routing takes over: transient and unclassified errors retry
// through the queue's retry tiers, permanent ones ([retry.Permanent]) and
// exhausted retries park the event.
//
// Events carry no idempotency key: a publisher that publishes the same
// fact twice, with two message ids, is handled twice. A subscriber whose
// effect must happen once per business fact guards it itself (a unique
// key on its own table).
package subscriber

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
)

// Func handles one event in the consumer's transaction. It may write the
// service's own tables and publish through the outbox with tx. A nil
// error commits; an error rolls back and is retried or parked by its class
// (runtime/retry).
type Func func(ctx context.Context, tx pgx.Tx, event message.Message) error

type eventKey struct{}

// Handler returns a consumer handler that calls fn for each delivered event
// of service. The event's envelope is in the context ([Event], [Meta]).
func Handler(service string, fn Func) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		if d == nil || d.Message == nil {
			return retry.Permanent(fmt.Errorf("subscriber %s: delivery without a decoded message", service))
		}
		env := &d.Envelope
		if err := fn(context.WithValue(ctx, eventKey{}, env), tx, d.Message); err != nil {
			return fmt.Errorf("subscriber %s: handle %s %s: %w", service, env.MessageType, env.MessageID, err)
		}
		return nil
	}
}

// Event returns the envelope of the event being handled, inside a Func run
// by [Handler].
func Event(ctx context.Context) (*message.Envelope, bool) {
	env, ok := ctx.Value(eventKey{}).(*message.Envelope)
	return env, ok
}

// Meta returns the publishing metadata of a message a subscriber sends in
// reaction to the event being handled: causation = the event's message id,
// and the event's correlation id, saga id, saga type and trace context.
// Outside a Func run by [Handler] it returns the zero Meta.
func Meta(ctx context.Context) message.Meta {
	env, ok := Event(ctx)
	if !ok {
		return message.Meta{}
	}
	return message.Meta{
		CorrelationID: env.CorrelationID,
		CausationID:   env.MessageID,
		SagaID:        env.SagaID,
		SagaType:      env.SagaType,
		Traceparent:   env.Traceparent,
		Tracestate:    env.Tracestate,
	}
}

// UnexpectedEvent is the error of generated <Svc>SubscriberFunc dispatch
// for an event service does not subscribe to: permanent, as no retry
// changes it.
func UnexpectedEvent(service string, event message.Message) error {
	name := "<nil>"
	if event != nil && event.SagaMessageInfo() != nil {
		name = event.SagaMessageInfo().FullName
	}
	return retry.Permanent(fmt.Errorf("subscriber %s: unexpected event %s", service, name))
}
