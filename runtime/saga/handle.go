package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Handle applies one delivered reply or event to its saga instance in the
// caller's transaction. It has the signature of a [consumer.HandlerFunc];
// a consumer of the saga's reply queue takes the engine itself as its
// [consumer.BatchHandler] ([Engine.HandleBatch]), which runs Handle for each
// delivery of a batch.
//
// The instance is found by the envelope's SagaID, or, for an external event
// that carries none, by the message's CorrelationKey as business key. Its row
// is locked (SELECT ... FOR UPDATE), which serializes concurrent messages for
// one saga; the machine classifies and applies the message; the new state is
// written with a version guard; emitted messages go to the outbox; one audit
// row records the outcome. Duplicates, late, invalid and conflicting messages
// are audited and acknowledged (nil error); a conflicting message sends the
// saga to manual review if the definition says so.
//
// The saga's business cancel message (Definition.Cancel) is found like an
// event, and its audit row names who asked and why (its RequestedBy and
// Reason fields) as operator and reason.
//
// A delivered start message (Definition.StartMessage, without a saga id)
// starts an instance through [Engine.StartTx], idempotently on its business
// key, so one queue can carry a saga's start commands and its replies.
//
// Errors: a message for a saga id that does not exist, for another saga type,
// or without any way to find its saga is marked [retry.Permanent] (the
// consumer parks it with the reason). So is a misaddressed reply, whose
// causation id names no command the saga sent for what the reply answers
// ([sagadef.ErrMisaddressed]): the reason, "misaddressed reply: ...", names
// the header that is wrong (x-causation-id, or x-saga-id when the causation
// id is another saga's command). An event whose business key names no
// saga yet is marked [retry.Early]: the saga may start, so the consumer
// retries it through its tiers before parking it (about two minutes with
// retry.Default). An external step's event that arrives while the saga is
// still on its way to the step is recorded in the saga and acknowledged
// (class early): it settles the step when the saga gets there. Hook errors and database errors are
// returned as they are, classified by the consumer. Run by a consumer, the
// instance update, the audit row and the outbox rows are not written by
// Handle: on the consumer's fast path they are staged and written with those
// of the whole batch, one statement per kind, before the commit; on its
// savepoint path they are queued and sent in one round trip when the handler
// returns. Their errors (a version conflict, say) fail the batch or the
// delivery there rather than being returned by Handle.
func (e *Engine) Handle(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
	if d == nil || d.Message == nil {
		return retry.Permanent(errors.New("saga handle: delivery without a decoded message"))
	}
	env := &d.Envelope
	kind := env.MessageType
	if info := d.Message.SagaMessageInfo(); info != nil {
		if kind == "" {
			kind = info.FullName
		} else if info.FullName != kind {
			return retry.Permanent(fmt.Errorf("saga handle: message %s: envelope type %s does not match decoded type %s",
				env.MessageID, kind, info.FullName))
		}
	}
	if e.cfg.Registry != nil {
		if _, ok := e.cfg.Registry.Lookup(kind); !ok {
			return retry.Permanent(fmt.Errorf("saga handle: message %s: unknown message type %s", env.MessageID, kind))
		}
	}
	parent := e.fromParent(env, kind) // a child's start or cancel (child.go)
	if env.SagaType != "" && env.SagaType != e.def.Name && parent == nil {
		return retry.Permanent(fmt.Errorf("saga handle: message %s (%s) belongs to saga type %s, this engine runs %s",
			env.MessageID, kind, env.SagaType, e.def.Name))
	}
	// What this handler queued so far (a saga started or moved by the same
	// handler) must be visible to the reads below.
	if err := txq.Sync(ctx, tx); err != nil {
		return err
	}
	sagaID := env.SagaID
	if parent != nil {
		sagaID = "" // the parent's: the instance is found by business key
	}
	if kind == e.def.StartMessage && sagaID == "" {
		return e.handleStart(ctx, tx, d, parent)
	}
	if d.Unclaimed != "" {
		before, err := e.handledBefore(ctx, tx, d)
		if err != nil {
			return err
		}
		if before {
			e.cfg.Logger.DebugContext(ctx, "saga message handled before (inbox): no effect", "saga_type", e.def.Name,
				"saga_id", sagaID, "message_id", env.MessageID, "message_type", kind)
			return nil
		}
	}
	w, err := e.lockFor(ctx, tx, sagaID, d)
	if err != nil {
		return err
	}
	trig := sagadef.Trigger{
		Kind:        kind,
		Message:     d.Message,
		MessageID:   env.MessageID,
		CausationID: env.CausationID,
	}
	if service, ok, err := message.HeaderString(env.Headers, message.HeaderOnce); ok && err == nil && service != "" {
		trig.Once = true
	}
	trig.Reason = e.childReviewReason(env, kind) // a child in manual review (child.go)
	if kind == e.def.Cancel.Message {
		// The audit row names who asked for the cancel and why.
		trig.Operator, trig.Reason = e.def.CancelRequest(d.Message)
	}
	out, err := e.transition(ctx, tx, w, trig, origin{Traceparent: env.Traceparent, Tracestate: env.Tracestate, Attempt: d.Attempt, ReceivedAt: d.ReceivedAt,
		Parent: parent != nil})
	if ce := (*sagadef.CausationError)(nil); errors.As(err, &ce) {
		return retry.Permanent(e.misaddressed(ctx, tx, env, w.ID, ce))
	}
	if err != nil {
		return err
	}
	res := out.Result
	if d.Unclaimed != "" && res.Class != sagadef.ClassNew {
		if err := e.claimRepeatable(ctx, tx, d); err != nil {
			return err
		}
	}
	level := e.cfg.Logger.DebugContext
	if res.Class != sagadef.ClassNew {
		level = e.cfg.Logger.InfoContext
	}
	level(ctx, "saga message handled", "saga_type", e.def.Name, "saga_id", w.ID,
		"message_id", env.MessageID, "message_type", kind, "correlation_id", env.CorrelationID, "causation_id", env.CausationID,
		"class", res.Class.String(), "from", w.State, "to", res.Instance.State, "version", out.Version)
	return nil
}

// handledBefore reports whether the inbox names d, a delivery its consumer
// claimed nothing for (consumer.Delivery.Unclaimed): from the read
// HandleBatch made for the batch, or by a read of its own.
//
// A saga queue's consumer claims nothing in the inbox when its handler is
// the engine run by a host: the engine's own record of a saga drops a
// redelivered message. A message it applies as new (class new) is recorded
// in the instance it moved — a step's or compensation's outcome, the step
// it settled, the pending command it answered — and a redelivery, which
// locks the same instance after that transition committed, is classified
// as a duplicate. Any other class (duplicate, late, invalid, conflicting, early)
// may have effects a second classification would repeat (an audit row, a
// review reason appended again), so such a delivery is claimed in the
// inbox (claimRepeatable) and a redelivery of it is dropped here, with no
// effect and no audit row, as a claimed message is dropped by a consumer
// that claims.
func (e *Engine) handledBefore(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) (bool, error) {
	id := d.Envelope.MessageID
	if id == "" {
		return false, nil
	}
	if p, ok := txq.PartIf(tx, prefetchKey{e.table}); ok {
		if p := p.(*prefetched); p.consumer == d.Unclaimed && p.claimed != nil {
			return p.claimed[id], nil
		}
	}
	claimed, err := inbox.Claimed(ctx, tx, d.Unclaimed, []string{id})
	if err != nil {
		return false, fmt.Errorf("saga %s: message %s: %w", e.def.Name, id, err)
	}
	return claimed[id], nil
}

// claimRepeatable claims d in the inbox after a transition of a class other
// than new (see handledBefore). A claim already there — another
// transaction committed it meanwhile, or a copy of the same message earlier
// in this batch took it — means the message was handled: the delivery
// fails as transient, its effects roll back, and its retry finds the claim.
func (e *Engine) claimRepeatable(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
	id := d.Envelope.MessageID
	if id == "" {
		return nil
	}
	first, err := inbox.Claim(ctx, tx, d.Unclaimed, id)
	if err != nil {
		return fmt.Errorf("saga %s: message %s (%s): %w", e.def.Name, id, d.Envelope.MessageType, err)
	}
	if !first {
		return retry.Transient(fmt.Errorf("saga %s: message %s (%s) was handled by another transaction meanwhile: not applied twice",
			e.def.Name, id, d.Envelope.MessageType))
	}
	return nil
}

// misaddressed says, for a reply whose causation names no command this saga
// sent for what the reply answers, which header is wrong: the reason the
// consumer parks it with. When the causation id is a message another saga
// sent (the outbox knows it), the reply went to the wrong saga.
func (e *Engine) misaddressed(ctx context.Context, tx pgx.Tx, env *message.Envelope, sagaID string, ce *sagadef.CausationError) error {
	head := fmt.Sprintf("message %s (%s) to saga %s %s: header %s",
		env.MessageID, env.MessageType, e.def.Name, sagaID, message.HeaderCausationID)
	want := "a reply carries the message id of the command it answers, here " + ce.Expected()
	c := ce.CausationID
	switch {
	case c == "":
		return fmt.Errorf("%w: %s is missing; %s", sagadef.ErrMisaddressed, head, want)
	case ce.NamedStep != "":
		named := "the command of step " + ce.NamedStep
		if ce.NamedCompensation {
			named = "the compensation of step " + ce.NamedStep
		}
		return fmt.Errorf("%w: %s %q names %s, but %s answers %s", sagadef.ErrMisaddressed, head, c, named, shortName(env.MessageType), ce.Expected())
	}
	if utf8.ValidString(c) && !strings.ContainsRune(c, 0) {
		// A failed read would abort the transaction the batch shares:
		// only ids PostgreSQL can compare are looked up.
		sent, ok, err := outbox.Lookup(ctx, tx, c)
		if err != nil {
			return err
		}
		if ok && sent.SagaID != "" && sent.SagaID != sagaID {
			by := fmt.Sprintf("header %s names saga %s", message.HeaderSagaID, sagaID)
			if env.SagaID == "" {
				by = fmt.Sprintf("its correlation key (no %s) names saga %s", message.HeaderSagaID, sagaID)
			}
			return fmt.Errorf("%w: %s %q names %s of saga %s %s, but %s", sagadef.ErrMisaddressed, head, c, shortName(sent.MessageType),
				sent.SagaType, sent.SagaID, by)
		}
	}
	return fmt.Errorf("%w: %s %q names no command this saga sent; %s", sagadef.ErrMisaddressed, head, c, want)
}

// shortName returns the last dot-separated part of a full name.
func shortName(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// handleStart starts a saga from a delivered start message. A redelivery
// with a new message id finds the instance by business key and starts
// nothing. A parent's start (a child step's) records the parent.
func (e *Engine) handleStart(ctx context.Context, tx pgx.Tx, d *consumer.Delivery, parent *sagadef.Parent) error {
	env := &d.Envelope
	_, _, err := e.startTx(ctx, tx, d.Message, parent, message.Meta{
		MessageID:   env.MessageID,
		CausationID: env.CausationID,
		Traceparent: env.Traceparent,
		Tracestate:  env.Tracestate,
	})
	return err
}

// lockFor finds and locks the instance a delivery belongs to.
func (e *Engine) lockFor(ctx context.Context, tx pgx.Tx, sagaID string, d *consumer.Delivery) (row, error) {
	if sagaID != "" {
		id, err := uuid.Parse(sagaID)
		if err != nil {
			return row{}, retry.Permanent(fmt.Errorf("saga handle: message %s: saga id %q is not a UUID", d.Envelope.MessageID, sagaID))
		}
		// Every form uuid.Parse takes (urn:uuid:, braces, upper case), as
		// a batch's prefetch takes it: PostgreSQL takes only some of them.
		sagaID = id.String()
		w, err := e.loadIn(ctx, tx, e.q.lockByID, sagaID)
		if errors.Is(err, ErrNotFound) {
			return row{}, retry.Permanent(fmt.Errorf("saga handle: message %s: saga %s %s: %w",
				d.Envelope.MessageID, e.def.Name, sagaID, ErrNotFound))
		}
		if err != nil {
			return row{}, fmt.Errorf("lock saga %s: %w", sagaID, err)
		}
		return w, nil
	}
	key := d.Message.CorrelationKey()
	if key == "" {
		return row{}, retry.Permanent(fmt.Errorf("saga handle: message %s (%s) has neither a saga id nor a correlation key",
			d.Envelope.MessageID, d.Envelope.MessageType))
	}
	w, err := e.loadIn(ctx, tx, e.q.lockByKey, key)
	if errors.Is(err, ErrNotFound) {
		// A contract may correlate on the saga id rather than the
		// business key.
		if _, perr := uuid.Parse(key); perr == nil {
			w, err = e.loadIn(ctx, tx, e.q.lockByID, key)
		}
	}
	if errors.Is(err, ErrNotFound) {
		// Unlike a saga id, which exists before any message names it, a
		// business key may name a saga whose start is still on its way
		// (queued behind this event, or in a retry tier): retried, then
		// parked when it never starts.
		return row{}, retry.Early(fmt.Errorf("saga handle: message %s: no saga %s with business key %q (yet): %w",
			d.Envelope.MessageID, e.def.Name, key, ErrNotFound))
	}
	if err != nil {
		return row{}, fmt.Errorf("lock saga by business key %q: %w", key, err)
	}
	return w, nil
}
