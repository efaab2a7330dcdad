package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// origin is what the engine knows about the cause of a transition beyond the
// trigger itself: the trace context to continue in emitted messages.
type origin struct {
	Traceparent string
	Tracestate  string
	// Attempt and ReceivedAt come from a delivered message (a span
	// attribute; the start of the step latency); zero otherwise.
	Attempt    int
	ReceivedAt time.Time
	// Link is a trace the transition's span links to: for a timeout, the
	// trace of the command that went unanswered.
	Link trace.SpanContext
	// Parent is set when the trigger is a parent saga's start or cancel
	// message (child.go).
	Parent bool
	// Flush sends the transition's queued writes before its span ends, so
	// that a write that fails ends the span with the error. The timeout
	// scanner sets it; a consumer's handler does not (its writes go out
	// with the batch, and the consumer's span reports a failed batch).
	Flush bool
}

// outcome is a transition as persisted.
type outcome struct {
	Result  sagadef.Result
	Version int64 // version after the transition
	Changed bool
}

// transition applies trig to the locked row w and persists the result, its
// messages and its audit row in tx. The caller holds the row lock (or has
// just inserted the row).
func (e *Engine) transition(ctx context.Context, tx pgx.Tx, w row, trig sagadef.Trigger, o origin) (out outcome, err error) {
	ctx, span := e.tel.startTransition(ctx, telemetry.SpanTransition, w, trig, o)
	defer func() {
		if err == nil && o.Flush {
			err = txq.Sync(ctx, tx)
		}
		e.tel.endTransition(ctx, tx, span, w, trig, o, out, err)
	}()
	inst, err := e.instanceFor(w, trig.Kind)
	if errors.Is(err, ErrUnreadableData) {
		return outcome{}, retry.Permanent(fmt.Errorf("%s: %w", trig.Kind, err))
	}
	if err != nil {
		return outcome{}, err
	}
	res, err := e.def.Apply(ctx, e.env(), inst, trig)
	if err != nil {
		err = fmt.Errorf("apply %s to saga %s in state %s: %w", trig.Kind, w.ID, w.State, err)
		if errors.Is(err, sagadef.ErrInvalidTrigger) || errors.Is(err, sagadef.ErrUnknownState) ||
			errors.Is(err, sagadef.ErrNotCompiled) || errors.Is(err, sagadef.ErrMisaddressed) {
			// No retry can change the outcome: park the message.
			err = retry.Permanent(err)
		}
		return outcome{}, err
	}
	return e.persist(ctx, tx, w, res, trig, o)
}

// persist writes a machine result: the instance update (version-guarded, only
// when something changed), the emitted messages and one audit row. On a
// consumer's fast path all three are staged for the batch's flush (see
// staged.go); otherwise they go out as one pipeline: queued in the
// handler's write scope when a consumer runs the engine (sent when the
// handler returns), in a scope of its own otherwise.
func (e *Engine) persist(ctx context.Context, tx pgx.Tx, w row, res sagadef.Result, trig sagadef.Trigger, o origin) (outcome, error) {
	after := res.Instance
	after.ID = w.ID
	markParentCancel(&after, trig, o)
	enc, err := encode(after, w.Data)
	if err != nil {
		return outcome{}, err
	}
	tx, scope, owned := txq.Open(tx)
	out := outcome{Result: res, Version: w.Version}
	if changed(w, after, enc) {
		out.Changed = true
		out.Version = w.Version + 1
		if p := e.stagedUpdatesFor(ctx, tx); p != nil {
			p.stage(w, after, enc, out.Version, e.cfg.Now(), func(_ pgconn.CommandTag, err error) error {
				if err != nil {
					return fmt.Errorf("update saga %s to %s: %w", w.ID, after.State, err)
				}
				return nil
			})
		} else if err := txq.Exec(ctx, tx, func(tag pgconn.CommandTag, err error) error {
			if err != nil {
				return fmt.Errorf("update saga %s to %s: %w", w.ID, after.State, err)
			}
			if tag.RowsAffected() != 1 {
				// Only possible when a caller did not lock the row: the
				// guard refuses to overwrite a concurrent transition.
				// Transient: a retry reloads the row and classifies again.
				return retry.Transient(fmt.Errorf("update saga %s: %w", w.ID,
					&VersionConflictError{SagaID: w.ID, Expected: w.Version, State: w.State}))
			}
			return nil
		}, e.q.update, w.ID, w.Version, after.State, out.Version, enc.Data, after.Attempt,
			after.PendingMessageID, string(enc.Progress), enc.TimeoutAt, enc.DeadlineAt,
			after.LastError, after.ReviewReason, e.cfg.Now()); err != nil {
			return outcome{}, err
		}
	}
	if err := e.emit(ctx, tx, w.ID, res.Emit, trig.MessageID, o); err != nil {
		return outcome{}, err
	}
	from, to := res.From, res.To
	if from == "" {
		from = w.State
	}
	if to == "" {
		to = after.State
	}
	if err := e.audit(ctx, tx, auditEntry{
		SagaID: w.ID, From: from, To: to, Trigger: trig.Kind, Class: res.Class.String(),
		MessageID: trig.MessageID, CausationID: trig.CausationID, Operator: trig.Operator,
		Note: note(trig.Reason, res), Version: out.Version,
	}); err != nil {
		return outcome{}, err
	}
	if err := e.queueCallback(ctx, tx, w, after, from, to); err != nil {
		return outcome{}, err
	}
	if err := e.replyToParent(ctx, tx, w.ID, after, from, to, trig, o); err != nil {
		return outcome{}, err
	}
	if owned {
		if err := scope.Flush(ctx); err != nil {
			return outcome{}, err
		}
	}
	return out, nil
}

// emit writes the transition's messages to the outbox in order. Each carries
// the saga's identity; its causation is the message that triggered the
// transition (empty for timeouts and operator actions).
func (e *Engine) emit(ctx context.Context, tx pgx.Tx, sagaID string, msgs []sagadef.Outgoing, causation string, o origin) error {
	if len(msgs) == 0 {
		return nil
	}
	now := e.cfg.Now()
	envs := make([]message.Envelope, 0, len(msgs))
	for _, m := range msgs {
		if m.Message == nil {
			return fmt.Errorf("saga %s: transition emitted a nil message", sagaID)
		}
		env, err := message.New(m.Message, message.Meta{
			MessageID:     m.MessageID,
			CorrelationID: sagaID,
			CausationID:   causation,
			SagaID:        sagaID,
			SagaType:      e.def.Name,
			Traceparent:   o.Traceparent,
			Tracestate:    o.Tracestate,
			OccurredAt:    now,
		})
		if err != nil {
			return fmt.Errorf("saga %s: envelope for %s: %w", sagaID, m.Message.SagaMessageInfo().FullName, err)
		}
		if m.OperatorRetry > 0 || m.Compensates != "" {
			env.Headers = map[string]any{}
			if m.OperatorRetry > 0 {
				env.Headers[message.HeaderOperatorRetry] = m.OperatorRetry
			}
			if m.Compensates != "" {
				env.Headers[message.HeaderCompensates] = m.Compensates
			}
		}
		envs = append(envs, env)
	}
	if err := outbox.Enqueue(ctx, tx, envs...); err != nil {
		return fmt.Errorf("saga %s: enqueue %d messages: %w", sagaID, len(envs), err)
	}
	return nil
}

// auditEntry is one saga_audit row.
type auditEntry struct {
	SagaID      string
	From, To    string
	Trigger     string
	Class       string
	MessageID   string
	CausationID string
	Operator    string
	Note        string
	Version     int64
}

func (e *Engine) audit(ctx context.Context, tx pgx.Tx, a auditEntry) error {
	result := func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("audit saga %s %s (%s): %w", a.SagaID, a.Trigger, a.Class, err)
		}
		return nil
	}
	at := e.cfg.Now()
	if p, ok := txq.PartFor(tx, auditKey{}, func() txq.Part { return &auditRows{} }); ok {
		// A consumer's fast path: the audit rows of all its handlers,
		// of every saga type, go out as one insert before the commit.
		p.(*auditRows).add(a, e.def.Name, at, result)
		return nil
	}
	return txq.Exec(ctx, tx, result, e.q.insertAudit, a.SagaID, e.def.Name, a.From, a.To, a.Trigger, a.Class,
		a.MessageID, a.CausationID, a.Operator, a.Note, a.Version, at)
}

// auditKey names the audit's part of a txq.Stage.
type auditKey struct{}

// auditRows is the audit rows of one consumer fast-path transaction, one
// array per column.
type auditRows struct {
	sagaIDs, sagaTypes, froms, tos, triggers, classes []string
	messageIDs, causationIDs, operators, notes        []string
	versions                                          []int64
	ats                                               []time.Time
	results                                           []txq.Result
}

func (r *auditRows) add(a auditEntry, sagaType string, at time.Time, result txq.Result) {
	r.sagaIDs, r.sagaTypes = append(r.sagaIDs, a.SagaID), append(r.sagaTypes, sagaType)
	r.froms, r.tos = append(r.froms, a.From), append(r.tos, a.To)
	r.triggers, r.classes = append(r.triggers, a.Trigger), append(r.classes, a.Class)
	r.messageIDs, r.causationIDs = append(r.messageIDs, a.MessageID), append(r.causationIDs, a.CausationID)
	r.operators, r.notes = append(r.operators, a.Operator), append(r.notes, a.Note)
	r.versions, r.ats = append(r.versions, a.Version), append(r.ats, at)
	r.results = append(r.results, result)
}

// insertAuditRowsSQL writes many audit rows, in order.
const insertAuditRowsSQL = `INSERT INTO saga_audit (saga_id, saga_type, from_state, to_state, trigger, class,
	message_id, causation_id, operator, note, version, at)
SELECT si::uuid, st, f, t, tr, c, m, ca, o, n, v, a
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::text[], $10::text[], $11::int8[], $12::timestamptz[])
  WITH ORDINALITY AS u(si, st, f, t, tr, c, m, ca, o, n, v, a, ord)
ORDER BY ord`

func (r *auditRows) Queue(ctx context.Context, tx pgx.Tx) {
	results := txq.Results(r.results)
	_ = txq.Exec(ctx, tx, func(tag pgconn.CommandTag, err error) error {
		if e := results(tag, err); e == nil || err == nil {
			return e // nothing failed, or a caller's own check did
		}
		return fmt.Errorf("insert the batch's %d audit rows (sagas %s…): %w", len(r.sagaIDs), r.sagaIDs[0], err)
	}, insertAuditRowsSQL, r.sagaIDs, r.sagaTypes, r.froms, r.tos,
		r.triggers, r.classes, r.messageIDs, r.causationIDs, r.operators, r.notes, r.versions, r.ats)
}

func (r *auditRows) Discard(err error) { _ = txq.Results(r.results)(pgconn.CommandTag{}, err) }

// note is an audit row's note: the trigger's reason, unless the machine's
// note already says it (an operator's repair does), then the machine's.
func note(reason string, res sagadef.Result) string {
	if reason = strings.TrimSpace(reason); reason == "" || res.ReasonNoted {
		return res.Note
	}
	return withReason(reason, res.Note)
}

// withReason is a note saying reason and then detail.
func withReason(reason, detail string) string {
	if detail == "" {
		return "reason: " + reason
	}
	return "reason: " + reason + "; " + detail
}
