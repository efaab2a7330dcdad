package admin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

func (s *Server) handleReplay(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id, err := parseParkedID(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req ReplayRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	res, err := s.replay(r.Context(), principalOf(r.Context()), id, reason, req.DryRun, req.Force)
	if err != nil {
		return err
	}
	if res.Outcome == OutcomeRefused {
		return &apiError{status: http.StatusConflict, body: Error{Code: "refused",
			Message: "replay refused by the saga-state check: " + res.Check.Explanation, Detail: res}}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) handleBulkReplay(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	var req BulkReplayRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	n, err := bulkMax(req.Max)
	if err != nil {
		return err
	}
	f := req.Filter
	if err := bulkFilter(f, "replay"); err != nil {
		return err
	}
	rows, err := s.listParked(r.Context(), f, parked.OldestFirst, 0, n+1)
	if err != nil {
		return err
	}
	out := BulkReplayResult{DryRun: req.DryRun, Counts: map[string]int{}, Items: []ReplayResult{}}
	if len(rows) > n {
		rows, out.Truncated = rows[:n], true
	}
	p := principalOf(r.Context())
	for _, row := range rows {
		res, err := s.replay(r.Context(), p, row.ID, reason, req.DryRun, false)
		if err != nil {
			s.cfg.Logger.ErrorContext(r.Context(), "bulk replay item failed", "parked_id", row.ID, "error", err)
			res = ReplayResult{Outcome: OutcomeError, Parked: row.Parked, Check: ReplayCheck{Explanation: errorText(err)}}
		}
		out.Counts[res.Outcome]++
		out.Items = append(out.Items, res)
	}
	s.cfg.Logger.InfoContext(r.Context(), "admin bulk replay", "operator", p.Name, "reason", reason, "dry_run", req.DryRun, "counts", out.Counts)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// bulkFilter checks the filter of a bulk action on parked messages.
func bulkFilter(f ParkedFilter, verb string) error {
	if f.IncludeReplayed {
		return badRequest("filter: include_replayed cannot be used to %s (closed messages stay closed)", verb)
	}
	f.OlderThan, f.NewerThan = "", "" // ages alone select too much
	if f == (ParkedFilter{}) {
		return badRequest("filter: name at least one of saga_type, saga_id, queue, message_type, reason")
	}
	return nil
}

// errorText is what an API answer may say about err: the message of an
// apiError, or a generic text (details go to the log).
func errorText(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.body.Message
	}
	return "internal error (see the server log)"
}

// replay republishes parked message id through the outbox, after checking
// its saga's state, in one transaction that also marks the parked row (and
// every open row of the same message and routing) replayed and writes a
// TriggerReplay row in the saga's audit trail. A row already replayed is not
// replayed again (OutcomeAlreadyReplay). A refused check returns
// OutcomeRefused and changes nothing unless force is set.
func (s *Server) replay(ctx context.Context, p Principal, id int64, reason string, dryRun, force bool) (ReplayResult, error) {
	var res ReplayResult
	err := txq.Do(ctx, s.cfg.Pool, s.cfg.Logger, nil, func(ctx context.Context, tx pgx.Tx) error {
		res = ReplayResult{}
		row, err := s.loadParked(ctx, tx, id, false)
		if err != nil {
			return err
		}
		if !dryRun {
			if row, err = lockSiblings(ctx, tx, row); err != nil {
				return err
			}
		}
		rows := []parkedRow{row}
		if err := s.join(ctx, rows); err != nil {
			return err
		}
		row = rows[0]
		res.Parked = row.Parked
		if row.ReplayedAt != nil {
			res.Outcome = OutcomeAlreadyReplay
			res.MessageID = row.MessageID
			res.Check = ReplayCheck{Explanation: fmt.Sprintf("replayed at %s by %s", row.ReplayedAt.Format(time.RFC3339), row.ReplayedBy)}
			return nil
		}
		if row.DismissedAt != nil {
			res.Outcome = OutcomeAlreadyClosed
			res.Check = ReplayCheck{Explanation: fmt.Sprintf("dismissed at %s by %s: %s", row.DismissedAt.Format(time.RFC3339), row.DismissedBy, row.DismissReason)}
			return nil
		}
		t, st, check, err := s.check(ctx, tx, row, dryRun)
		if err != nil {
			return err
		}
		res.Check = check
		switch {
		case dryRun && check.Allowed:
			res.Outcome = OutcomeWouldReplay
			return nil
		case !check.Allowed && (dryRun || !force):
			res.Outcome = OutcomeRefused
			return nil
		}
		if err := republish(ctx, tx, row); err != nil {
			return err
		}
		now := s.cfg.Now().UTC()
		forced := !check.Allowed
		marked, err := parked.MarkReplayed(ctx, tx, row.routing(), now, p.Name, reason, forced)
		if err != nil {
			return fmt.Errorf("mark parked message %d replayed: %w", id, err)
		}
		for _, m := range marked {
			if m != id {
				res.AlsoMarked = append(res.AlsoMarked, m)
			}
		}
		if t != nil && st != nil {
			detail := fmt.Sprintf("replayed parked message %d (%s) from queue %s; check: %s", id, short(row.MessageType), row.Queue, check.Explanation)
			if forced {
				detail = "FORCED past a refused check; " + detail
			}
			if _, err := t.engine.NoteTx(ctx, tx, saga.Note{SagaID: st.ID, Trigger: TriggerReplay, MessageID: row.MessageID,
				Operator: p.Name, Reason: reason, Detail: detail}); err != nil {
				return fmt.Errorf("audit replay of parked message %d: %w", id, err)
			}
		}
		res.Outcome = OutcomeReplayed
		res.MessageID = row.MessageID
		res.Parked.ReplayedAt, res.Parked.ReplayedBy, res.Parked.ReplayReason, res.Parked.ReplayForced = &now, p.Name, reason, forced
		return nil
	})
	if err != nil {
		return ReplayResult{}, err
	}
	if res.Outcome == OutcomeReplayed {
		s.cfg.Logger.InfoContext(ctx, "admin replayed parked message", "operator", p.Name, "reason", reason,
			"parked_id", id, "message_id", res.MessageID, "saga_id", res.Parked.SagaID, "forced", !res.Check.Allowed)
	}
	return res, nil
}

// lockSiblings locks the parked rows of row's message and routing that are
// still open, with row itself, in id order, and returns row as it is now.
// Replays of two such rows (one message parked by two subscribers) then
// queue up here, and the second finds its row replayed, instead of each
// locking its own row and deadlocking on the other's mark, or both
// republishing the message.
func lockSiblings(ctx context.Context, tx pgx.Tx, row parkedRow) (parkedRow, error) {
	rs, err := parked.LockSiblings(ctx, tx, row.ID, row.routing())
	if err != nil {
		return parkedRow{}, fmt.Errorf("lock parked message %d: %w", row.ID, err)
	}
	locked := parkedRowsOf(rs)
	for _, l := range locked {
		if l.ID == row.ID {
			return l, nil
		}
	}
	return parkedRow{}, apiErr(http.StatusNotFound, "not_found", "no parked message %d", row.ID)
}

// republish puts the parked message back into the outbox with its own
// message id, to its original exchange and routing key (outbox.Republish:
// the original row is released when this database published it, else the
// parked copy's envelope is enqueued).
func republish(ctx context.Context, tx pgx.Tx, row parkedRow) error {
	env, err := envelopeOf(row)
	if err != nil {
		return err
	}
	if err := outbox.Republish(ctx, tx, env); err != nil {
		return fmt.Errorf("replay parked message %d: %w", row.ID, err)
	}
	return nil
}

// transportHeaders are headers of a parked copy that describe its failed
// deliveries, not the message; a replay starts without them.
var transportHeaders = []string{
	message.HeaderAttempt, message.HeaderParkReason, message.HeaderParkClass, message.HeaderOrigExchange,
	message.HeaderOrigRoutingKey, message.HeaderOrigQueue, message.HeaderFirstFailureAt, "x-last-error",
	"x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
	"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-delivery-count",
}

// envelopeHeaders are the envelope's own fields carried as headers.
var envelopeHeaders = []string{
	message.HeaderSagaID, message.HeaderSagaType, message.HeaderCausationID, message.HeaderSchemaVersion,
	message.HeaderTraceparent, message.HeaderTracestate, message.HeaderIdempotency, message.HeaderOccurredAt,
}

// envelopeOf rebuilds the envelope of a parked message from its row.
func envelopeOf(row parkedRow) (message.Envelope, error) {
	h := row.headerMap()
	refuse := func(format string, args ...any) (message.Envelope, error) {
		return message.Envelope{}, apiErr(http.StatusConflict, "refused", "parked message %d cannot be replayed: "+format, append([]any{row.ID}, args...)...)
	}
	if row.MessageType == "" {
		return refuse("it has no message type (its envelope was invalid; it would be parked again)")
	}
	if row.Exchange == "" && row.RoutingKey == "" {
		return refuse("no original exchange or routing key was recorded")
	}
	sv, ok, err := message.HeaderInt(h, message.HeaderSchemaVersion)
	if err != nil || !ok || sv < 1 || sv > 1<<31-1 {
		return refuse("it has no valid %s header (it would be parked again)", message.HeaderSchemaVersion)
	}
	str := func(k string) string {
		v, _, _ := message.HeaderString(h, k)
		return v
	}
	env := message.Envelope{
		MessageID: row.MessageID, CorrelationID: row.CorrelationID, CausationID: str(message.HeaderCausationID),
		SagaID: str(message.HeaderSagaID), SagaType: str(message.HeaderSagaType),
		MessageType: row.MessageType, SchemaVersion: int32(sv), IdempotencyKey: str(message.HeaderIdempotency),
		Traceparent: str(message.HeaderTraceparent), Tracestate: str(message.HeaderTracestate),
		Exchange: row.Exchange, RoutingKey: row.RoutingKey, Body: row.body,
	}
	if row.LinkedBy == "" {
		// A message linked to its saga by its correlation id goes out as
		// it came, without saga metadata: its consumer finds the saga by
		// the same correlation.
		if env.SagaID == "" {
			env.SagaID = row.SagaID
		}
		if env.SagaType == "" {
			env.SagaType = row.SagaType
		}
	}
	if env.CorrelationID == "" {
		env.CorrelationID = env.SagaID
	}
	if at, ok, err := message.HeaderTime(h, message.HeaderOccurredAt); ok && err == nil {
		env.OccurredAt = at
	} else {
		env.OccurredAt = row.FirstFailureAt
	}
	extra := maps.Clone(h)
	for _, k := range append(transportHeaders, envelopeHeaders...) {
		delete(extra, k)
	}
	if len(extra) > 0 {
		env.Headers = extra
	}
	return env, nil
}

// check decides whether replaying row now makes sense for its saga. It
// returns the saga's type and status when the saga exists. The saga's row
// stays locked in tx from the check on, so what the check saw still holds
// when the replay commits: a timeout, a reply or an operator that would
// move the saga meanwhile waits for the replay (or, when it came first,
// the check sees its outcome). A dry run reads the saga without locking it.
// A saga that cannot be loaded (a database error) is an error: the
// transaction may be aborted, so the replay cannot go on, forced or not.
func (s *Server) check(ctx context.Context, tx pgx.Tx, row parkedRow, dryRun bool) (*sagaType, *saga.Status, ReplayCheck, error) {
	if row.SagaID == "" {
		return nil, nil, ReplayCheck{Allowed: true, Explanation: "the message names no saga: nothing to check; its consumer decides"}, nil
	}
	t, ok := s.byName[row.SagaType]
	if !ok {
		return nil, nil, ReplayCheck{Explanation: fmt.Sprintf("saga type %q is not served by this server: its state cannot be checked", row.SagaType)}, nil
	}
	id, err := parseSagaID(row.SagaID)
	if err != nil {
		return t, nil, ReplayCheck{Explanation: fmt.Sprintf("saga id %q is not a UUID: the message would be parked again", row.SagaID)}, nil
	}
	// A replay decides on the saga row it holds locked until it commits;
	// a dry run only looks (and locks nothing a live reply waits for).
	var st saga.Status
	if dryRun {
		st, err = t.engine.Status(ctx, id)
	} else {
		st, err = t.engine.StatusTx(ctx, tx, id)
	}
	if errors.Is(err, saga.ErrNotFound) {
		return t, nil, ReplayCheck{Explanation: fmt.Sprintf("saga %s does not exist: the message would be parked again", id)}, nil
	}
	if err != nil {
		// The transaction may be aborted: the replay cannot go on, forced
		// or not.
		return nil, nil, ReplayCheck{}, fmt.Errorf("replay check: load saga %s: %w", id, err)
	}
	c := ReplayCheck{SagaState: st.State}
	ref, ok := t.def.Lookup(row.MessageType)
	if !ok {
		c.Explanation = fmt.Sprintf("%s is not a message of saga %s", row.MessageType, t.def.Name)
		return t, &st, c, nil
	}
	switch ref.Use {
	case sagadef.UseCommand, sagadef.UseCompensation:
		c.Class = "pending-command"
		switch {
		case st.Terminal():
			c.Explanation = fmt.Sprintf("the saga ended in %s: its command must not run now", st.State)
		case st.PendingMessageID == row.MessageID:
			c.Allowed = true
			c.Explanation = fmt.Sprintf("the saga still waits for the reply to this command (state %s, attempt %d)", st.State, st.Attempt)
		default:
			c.Class = "stale-command"
			c.Explanation = fmt.Sprintf("the saga no longer waits for this command (state %s); use retry to resend its current step", st.State)
		}
		return t, &st, c, nil
	}
	info, ok := s.lookup(row.MessageType)
	if !ok {
		c.Class = "unknown"
		c.Allowed = !st.Terminal()
		c.Explanation = fmt.Sprintf("%s is unknown to this server, so it was not classified; the saga is in %s", row.MessageType, st.State)
		return t, &st, c, nil
	}
	m := info.New()
	if err := proto.Unmarshal(row.body, m); err != nil {
		c.Class = "invalid"
		c.Explanation = "the body does not decode: it would be parked again"
		return t, &st, c, nil
	}
	if st.DataError != "" {
		c.Class = "invalid"
		c.Explanation = st.DataError + ": a message for it would be parked again"
		return t, &st, c, nil
	}
	causation, _, _ := message.HeaderString(row.headerMap(), message.HeaderCausationID)
	inst := sagadef.Instance{
		ID: st.ID, Type: st.Type, BusinessKey: st.BusinessKey, State: st.State, Version: st.Version, Data: st.Data,
		Attempt: st.Attempt, PendingMessageID: st.PendingMessageID, Progress: st.Progress,
		TimeoutAt: st.TimeoutAt, DeadlineAt: st.DeadlineAt, LastError: st.LastError, ReviewReason: st.ReviewReason,
	}
	class := t.def.Classify(inst, sagadef.Trigger{Kind: row.MessageType, Message: m, MessageID: row.MessageID, CausationID: causation})
	c.Class = class.String()
	step, _ := t.def.LookupStep(ref.Step)
	switch class {
	case sagadef.ClassNew:
		c.Allowed = true
		c.Explanation = fmt.Sprintf("the saga waits for it in %s: it will be applied", st.State)
	case sagadef.ClassLate:
		c.Allowed = true
		c.Explanation = fmt.Sprintf("it is late for %s (saga in %s): the step's late-reply policy %q applies", ref.Step, st.State, step.Late)
	case sagadef.ClassEarly:
		c.Allowed = true
		c.Explanation = fmt.Sprintf("the saga has not reached %s yet (saga in %s): it will be recorded early and settle the step when the saga gets there", ref.Step, st.State)
	case sagadef.ClassConflicting:
		c.Allowed = true
		c.Explanation = "it contradicts the outcome recorded for its step: the saga will go to manual review"
	case sagadef.ClassDuplicate:
		c.Explanation = "its outcome is already recorded: replaying it would have no effect"
	default:
		c.Explanation = fmt.Sprintf("it is not part of the saga's conversation in state %s: it would only be audited", st.State)
	}
	return t, &st, c, nil
}

// bulkMax validates a bulk request's max.
func bulkMax(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultBulk, nil
	case n < 0 || n > MaxBulk:
		return 0, badRequest("max=%d: want 1 to %d", n, MaxBulk)
	}
	return n, nil
}
