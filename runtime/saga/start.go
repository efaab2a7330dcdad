package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// StartTx starts an instance for start in the caller's transaction: it
// inserts the instance row, writes the first commands to the outbox and
// audits the start, so all of it commits or none of it does.
//
// Starting is idempotent on the business key the Hooks derive from start:
// when an instance with that key exists (or is being inserted by a concurrent
// transaction that then commits), StartTx returns its id with created=false,
// sends nothing, and records the repeated start in the audit trail as a
// duplicate.
//
// meta carries the start message's identity: its MessageID becomes the
// causation id of the first commands, its trace context continues in them.
// Its SagaID, SagaType and CorrelationID are ignored (the engine assigns them).
func (e *Engine) StartTx(ctx context.Context, tx pgx.Tx, start message.Message, meta message.Meta) (sagaID string, created bool, err error) {
	return e.startTx(ctx, tx, start, nil, meta)
}

// startTx is StartTx for a start message a parent saga sent from a child
// step (parent non-nil), which the instance records.
func (e *Engine) startTx(ctx context.Context, tx pgx.Tx, start message.Message, parent *sagadef.Parent, meta message.Meta) (sagaID string, created bool, err error) {
	ctx, span := e.tel.startStart(ctx, messageMeta{messageID: meta.MessageID, causationID: meta.CausationID})
	var state string
	defer func() { e.tel.endStart(ctx, tx, span, sagaID, created, state, err) }()
	if start == nil {
		return "", false, retry.Permanent(errors.New("start saga: start message is nil"))
	}
	if name := start.SagaMessageInfo().FullName; e.def.StartMessage != "" && name != e.def.StartMessage {
		return "", false, retry.Permanent(fmt.Errorf("start saga %s: message %s is not its start message %s",
			e.def.Name, name, e.def.StartMessage))
	}
	id := e.cfg.NewID()
	res, err := e.def.Begin(ctx, e.env(), id, start)
	if err != nil {
		err = fmt.Errorf("begin saga %s: %w", e.def.Name, err)
		if errors.Is(err, sagadef.ErrInvalidTrigger) || errors.Is(err, sagadef.ErrNotCompiled) {
			err = retry.Permanent(err)
		}
		return "", false, err
	}
	inst := res.Instance
	inst.ID = id
	inst.Progress.Parent = parent
	if inst.BusinessKey == "" {
		return "", false, retry.Permanent(fmt.Errorf("start saga %s: hooks returned an empty business key", e.def.Name))
	}
	enc, err := encode(inst, nil)
	if err != nil {
		return "", false, err
	}
	now := e.cfg.Now()
	var got string
	err = tx.QueryRow(ctx, e.q.insert, id, inst.BusinessKey, inst.State, int64(1), enc.Data, inst.Attempt,
		inst.PendingMessageID, string(enc.Progress), enc.TimeoutAt, enc.DeadlineAt,
		inst.LastError, inst.ReviewReason, now).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return e.startExisting(ctx, tx, inst.BusinessKey, meta, parent)
	case err != nil:
		return "", false, fmt.Errorf("insert saga %s (business key %q): %w", e.def.Name, inst.BusinessKey, err)
	}
	tx, scope, owned := txq.Open(tx)
	if err := e.emit(ctx, tx, id, res.Emit, meta.MessageID, origin{Traceparent: meta.Traceparent, Tracestate: meta.Tracestate}); err != nil {
		return "", false, err
	}
	from := res.From
	to := res.To
	if to == "" {
		to = inst.State
	}
	state = to
	if err := e.audit(ctx, tx, auditEntry{
		SagaID: id, From: from, To: to, Trigger: sagadef.TriggerStart, Class: sagadef.ClassNew.String(),
		MessageID: meta.MessageID, CausationID: meta.CausationID, Note: res.Note, Version: 1,
	}); err != nil {
		return "", false, err
	}
	if err := e.replyToParent(ctx, tx, id, inst, from, to, sagadef.Trigger{}, origin{}); err != nil {
		return "", false, err
	}
	if owned {
		if err := scope.Flush(ctx); err != nil {
			return "", false, err
		}
	}
	e.cfg.Logger.DebugContext(ctx, "saga started", "saga_type", e.def.Name, "saga_id", id,
		"business_key", inst.BusinessKey, "state", to, "message_id", meta.MessageID)
	return id, true, nil
}

// startExisting handles a start whose business key is taken.
func (e *Engine) startExisting(ctx context.Context, tx pgx.Tx, key string, meta message.Meta, parent *sagadef.Parent) (string, bool, error) {
	w, err := e.loadIn(ctx, tx, e.q.existingByKey, key)
	if errors.Is(err, ErrNotFound) {
		// The conflicting row exists but this transaction cannot see it:
		// it runs at REPEATABLE READ or stricter with an older snapshot.
		// A retry in a new transaction sees it.
		return "", false, retry.Transient(fmt.Errorf("start saga %s: business key %q is taken by a row this transaction cannot see", e.def.Name, key))
	}
	if err != nil {
		return "", false, fmt.Errorf("load saga %s by business key %q: %w", e.def.Name, key, err)
	}
	if err := e.audit(ctx, tx, auditEntry{
		SagaID: w.ID, From: w.State, To: w.State, Trigger: sagadef.TriggerStart, Class: sagadef.ClassDuplicate.String(),
		MessageID: meta.MessageID, CausationID: meta.CausationID,
		Note: "start repeated for an existing business key; nothing sent", Version: w.Version,
	}); err != nil {
		return "", false, err
	}
	if parent != nil {
		if err := e.answerRepeatedStart(ctx, tx, w, parent); err != nil {
			return "", false, err
		}
	}
	return w.ID, false, nil
}

// Start is [Engine.StartTx] in a transaction of its own. After the commit
// the first commands go to the engine's relay ([Engine.HandOffTo]), or
// relays are woken to claim them; the start is counted in the metrics once
// it committed.
func (e *Engine) Start(ctx context.Context, start message.Message, meta message.Meta) (sagaID string, created bool, err error) {
	err = e.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		sagaID, created, err = e.StartTx(ctx, tx, start, meta)
		return err
	})
	if err != nil {
		return "", false, err
	}
	return sagaID, created, nil
}

// HandOffTo gives the engine a relay of this process (nil: none): the
// transactions the engine opens itself (Start, Operate, InTx, the timeout
// scanner) hand the outbox rows they commit to r after the commit, born
// leased to it, instead of waking relays to claim them (see
// runtime/outbox). A host gives its engines one of its relays while it
// runs. A consumer running the engine has its own (consumer.Config.Relay);
// StartTx and OperateTx in a transaction of the caller's own are not
// affected.
func (e *Engine) HandOffTo(r *outbox.Relay) { e.relay.Store(r) }

// handOff is the relay for a wake set of the engine's own transactions:
// nil (an untyped nil, so txq sees none) when it has none.
func (e *Engine) handOff() any {
	if r := e.relay.Load(); r != nil {
		return r
	}
	return nil
}

// InTx runs fn in a transaction of the engine's pool, as a consumer runs a
// handler: what the engine does in it through [Engine.OperateTx] and the
// like counts its metrics and hands its rows to a local relay only once the
// transaction has committed, and relays are woken after the commit. Start
// and Operate use it; so does the admin server's repair.
func (e *Engine) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return txq.Do(ctx, e.cfg.Pool, e.cfg.Logger.With("saga_type", e.def.Name), e.handOff(), fn)
}
