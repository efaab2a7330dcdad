// Package participant is the glue between a consumer and the code of a
// service that executes saga commands (a participant).
//
// A participant receives a command, applies its business effect and answers
// with a reply. [Handler] turns a [Func] into a [consumer.HandlerFunc] that
// does all of it in the consumer's transaction:
//
//	tx{ Func(cmd) → outbox.Enqueue(reply) } → commit → ack
//
// so the business effect and the reply commit together: there is no window in
// which the effect is applied but the reply is lost, or the reply is sent for
// an effect that rolled back. [BatchHandler] is the consumer.BatchHandler a
// host gives a participant's consumer: it reads the once records of a whole
// batch in one statement, runs Handler for each delivery, and writes the
// batch's new records in one statement before the commit.
//
// Business failures (out of stock, card declined) are replies, not errors: a
// Func returns the failure reply with a nil error, and the saga compensates.
// A returned error means "this command could not be processed now": the
// transaction rolls back and the consumer's failure routing (retry tiers,
// parking lot) takes over.
//
// # One row per command
//
// A saga that resends a command (a step retried after a timeout) sends a
// new message id with the same idempotency key, so effects must happen once
// per business operation: [Idempotent] runs a command once per type and
// idempotency key and answers a resend with the first reply. A participant
// registered through a host (runtime/host, generated
// Register<Service>Participant) runs under it without asking; [Once] guards
// single effects by hand.
//
// Idempotent writes one saga_participant_once row per command that ran,
// after the command's Func returned, in the same transaction as its effect:
// the key, the first reply, and the message id the command ran as. That row
// is all the deduplication a participant's queue needs, so a host's
// participant consumer claims nothing in the inbox
// (consumer.Config.HandlerDedupes):
//
//   - A duplicate delivery of the same message (a redelivery after a lost
//     acknowledgement, a crash between commit and ack, the relay publishing
//     a row twice) finds a row with its own message id: no effect and no
//     reply, as the first run's reply committed with it. Two copies in one
//     batch: the second finds the first's row in the batch.
//   - A resend (new message id, same key) finds the row and gets its reply;
//     a command a compensation overtook finds the row the compensation
//     wrote and has no effect. Such an answer writes no once record, so
//     under a consumer that claimed nothing (consumer.Delivery.Unclaimed)
//     it claims its message id in the inbox, and a redelivery of it is
//     dropped there. These are the rare paths; a command that runs
//     writes its once record only.
//   - A command that failed left no row (its transaction rolled back), so
//     its redelivery or retry runs it; an operator's retry after a recorded
//     failure is recorded under a key of its own and runs again.
//   - A command answered later ([ErrReplyLater]) has its row without a
//     reply; [ReplyLater] stores the reply there for resends.
//   - Two transactions running the same key at once (a resend overtaking
//     the first delivery) both find no row; the first to commit writes it,
//     and the other's insert finds it, fails, and rolls its effect back: its
//     retry finds the row. So the effect commits once.
//
// Only a handler that succeeds commits anything, and every success of
// Idempotent commits its row: a consumer whose handler is Idempotent (with no
// middleware that could succeed without reaching it) drops every duplicate
// the inbox would. Records are kept; they are the participant's history of
// commands run.
//
// A compensation can overtake the command it undoes. The saga compensates a
// step that stopped waiting without an answer (a timeout, an operator's
// compensate), since its effect may have happened; but the command may not
// have run yet (it waits in a retry tier, or its handler is slow), so the
// compensating command can be handled first and the command after it. The
// saga names the command on such a compensation (message.HeaderCompensates)
// and [Idempotent] records it as done while it handles the compensation:
// the command, arriving later, has no effect and sends no reply. This holds
// when the command and its compensation have the same owner, which is how
// contracts declare them.
//
// A participant that answers later (a human decision, a slow partner)
// takes the command with [Later], returns [ErrReplyLater], and replies from
// another transaction with the generated ReplyTo<Command>, which keeps the
// command's causation ([ReplyLater]).
package participant

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
)

// Func executes one command in the consumer's transaction and returns its
// reply. Business failures are replies (returned with a nil error). A nil
// reply with a nil error sends nothing (for commands that expect no answer).
type Func func(ctx context.Context, tx pgx.Tx, cmd message.Message) (reply message.Message, err error)

// Handler returns a consumer handler that calls fn for each delivered command
// and writes its reply to the outbox in the same transaction. The reply's
// envelope continues the command's conversation: CausationID is the
// command's MessageID; CorrelationID, SagaID and SagaType are copied from the
// command's envelope. Its trace context is the current span's: with tracing
// on, a "participant COMMAND" span (a child of the consumer's process span)
// wraps fn and the reply's outbox row; without, the command's trace context
// is passed on. Its exchange and routing key come
// from the reply type's generated Info.
func Handler(fn Func) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) (err error) {
		if d == nil || d.Message == nil {
			return retry.Permanent(errors.New("participant: delivery without a decoded message"))
		}
		cmd := &d.Envelope
		ctx, span := startSpan(ctx, cmd)
		defer func() { endSpan(span, err) }()
		ctx, rec := withOnceRecord(WithCommand(ctx, cmd))
		rec.unclaimed = d.Unclaimed
		reply, err := fn(ctx, tx, d.Message)
		if err != nil && !errors.Is(err, ErrReplyLater) {
			return fmt.Errorf("participant: handle %s %s (saga %s): %w", cmd.MessageType, cmd.MessageID, cmd.SagaID, err)
		}
		if err := claimUnguarded(ctx, tx, d, rec); err != nil {
			return err
		}
		if err != nil {
			return nil // effects commit; the participant answers later with ReplyEnvelope
		}
		if isNil(reply) {
			return nil
		}
		env, err := ReplyEnvelope(cmd, reply)
		if err != nil {
			return err
		}
		rec.mark(&env)
		if err := outbox.Enqueue(ctx, tx, env); err != nil {
			return fmt.Errorf("participant: enqueue reply %s to %s %s: %w",
				env.MessageType, cmd.MessageType, cmd.MessageID, err)
		}
		return nil
	}
}

// claimUnguarded claims d in the inbox when its consumer claimed nothing
// (consumer.Delivery.Unclaimed) and fn succeeded without [Idempotent]
// leaving what drops a redelivery (a middleware that answered by itself).
// A redelivery of such a message fails permanently: it ran before, and its
// repeated effects roll back with the error.
func claimUnguarded(ctx context.Context, tx pgx.Tx, d *consumer.Delivery, rec *onceRecord) error {
	if d.Unclaimed == "" || rec.deduped {
		return nil
	}
	first, err := inbox.Claim(ctx, tx, d.Unclaimed, d.Envelope.MessageID)
	if err != nil {
		return fmt.Errorf("participant: %s %s answered without its once record: %w", d.Envelope.MessageType, d.Envelope.MessageID, err)
	}
	if !first {
		return retry.Permanent(fmt.Errorf("participant: %s %s handled before and answered again without its once record: not applied twice",
			d.Envelope.MessageType, d.Envelope.MessageID))
	}
	return nil
}

// Defer runs a write whose result the participant does not need — a journal
// row, a stock update it has already checked — in tx. When a consumer runs
// the handler, the statement is queued and sent in one round trip with the
// handler's other queued writes (the stored reply of [Idempotent], the
// reply's outbox row) when the handler returns; its error, prefixed with
// what, then fails the delivery like a returned error would. Elsewhere it
// runs at once. Do not read back in the same handler what a deferred
// statement writes.
func Defer(ctx context.Context, tx pgx.Tx, what, sql string, args ...any) error {
	return txq.Exec(ctx, tx, func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}, sql, args...)
}

// ErrReplyLater, returned by a Func (or a generated participant method),
// commits the handler's effects and sends no reply now: the participant
// answers later, in another transaction, with the generated ReplyTo<Command>
// and the [Pending] it took with [Later]. The saga's step timeout still
// bounds the wait. Under [Idempotent], a resend of that command (the step
// timed out and retried it) is absorbed: the command answered later is the
// first one, so the reply cites the first attempt. Give such a step the
// late-reply policy "apply if still waiting" (LATE_REPLY_APPLY_IF_WAITING),
// under which a reply to an earlier attempt completes the step while the saga
// still waits on it; under "ignore" it would be dropped as late.
var ErrReplyLater = errors.New("participant: reply later")

type commandKey struct{}

// WithCommand returns ctx carrying cmd as the envelope of the command being
// handled, as [Handler] does for its Func: [Command] returns it, and
// [Idempotent] reads the command's headers from it (an operator's retry is
// recorded under a key of its own). Use it to run a Func, or a generated
// participant method, outside Handler.
func WithCommand(ctx context.Context, cmd *message.Envelope) context.Context {
	return context.WithValue(ctx, commandKey{}, cmd)
}

// Command returns the envelope of the command being handled, inside a Func
// run by [Handler]: keep it (it is small) to answer later with
// [ReplyEnvelope].
func Command(ctx context.Context) (*message.Envelope, bool) {
	env, ok := ctx.Value(commandKey{}).(*message.Envelope)
	return env, ok
}

// ReplyEnvelope builds the envelope of reply answering the command in cmd:
// a new message id, causation = the command's message id, and the command's
// correlation id, saga id, saga type and trace context. Handler uses it; it
// is exported for participants that answer later, outside the command's
// delivery (store the command's envelope, reply in another transaction).
func ReplyEnvelope(cmd *message.Envelope, reply message.Message) (message.Envelope, error) {
	if cmd == nil {
		return message.Envelope{}, errors.New("participant: reply envelope without the command's envelope")
	}
	if isNil(reply) {
		return message.Envelope{}, fmt.Errorf("participant: reply envelope for %s %s: nil reply", cmd.MessageType, cmd.MessageID)
	}
	env, err := message.New(reply, message.Meta{
		CorrelationID: cmd.CorrelationID,
		CausationID:   cmd.MessageID,
		SagaID:        cmd.SagaID,
		SagaType:      cmd.SagaType,
		Traceparent:   cmd.Traceparent,
		Tracestate:    cmd.Tracestate,
	})
	if err != nil {
		name := "<nil info>"
		if in := reply.SagaMessageInfo(); in != nil {
			name = in.FullName
		}
		return message.Envelope{}, fmt.Errorf("participant: envelope for reply %s to %s %s: %w",
			name, cmd.MessageType, cmd.MessageID, err)
	}
	return env, nil
}

// Reply adapts a typed participant method's results to a [Func]'s: generated
// <Svc>ParticipantFunc dispatch calls it for every command that declares
// replies. A nil reply with a nil error is refused as a permanent failure
// (return a reply, a business-failure reply, [ErrReplyLater] or an error).
func Reply[R message.Message](reply R, err error) (message.Message, error) {
	if err != nil {
		return nil, err
	}
	if isNil(reply) {
		return nil, retry.Permanent(errors.New("the handler returned neither a reply nor an error (return participant.ErrReplyLater to answer later)"))
	}
	return reply, nil
}

// isNil reports whether m holds no message: a nil interface, or a nil
// pointer in one (a typed participant method's `var r *Reply; return r, nil`
// must not go out as an empty reply).
func isNil(m message.Message) bool {
	if m == nil {
		return true
	}
	v := reflect.ValueOf(m)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// NoReply is [Reply] for a command whose contract declares no reply: a nil
// reply sends nothing.
func NoReply[R message.Message](reply R, err error) (message.Message, error) {
	if err != nil || isNil(reply) {
		return nil, err
	}
	return reply, nil
}

// UnexpectedCommand is the error of generated <Svc>ParticipantFunc dispatch
// for a command service does not own: permanent, as no retry changes it.
func UnexpectedCommand(service string, cmd message.Message) error {
	return retry.Permanent(fmt.Errorf("service %s: unexpected command %s", service, cmd.SagaMessageInfo().FullName))
}
