package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// actionTriggers maps API actions to the engine's operator triggers.
var actionTriggers = map[string]string{
	ActionRetry:      sagadef.TriggerOperatorRetry,
	ActionCompensate: sagadef.TriggerOperatorCompensate,
	ActionResolve:    sagadef.TriggerOperatorResolve,
	ActionCancel:     sagadef.TriggerOperatorCancel,
}

// action is one validated repair request.
type action struct {
	name    string // ActionRetry, ...
	trigger string
	reason  string
	to      string // resolve only
}

// target is the state a repeated action leaves the saga in, when its result
// does not depend on the machine (cancel, resolve): reaching it again is
// "already applied".
func (a action) target() string {
	switch a.name {
	case ActionCancel:
		return sagadef.StateCancelled
	case ActionResolve:
		return a.to
	}
	return ""
}

func parseAction(name, reason, to string) (action, error) {
	trig, ok := actionTriggers[name]
	if !ok {
		return action{}, apiErr(http.StatusNotFound, "not_found", "unknown action %q (want retry, compensate, resolve or cancel)", name)
	}
	reason, err := checkReason(reason)
	if err != nil {
		return action{}, err
	}
	a := action{name: name, trigger: trig, reason: reason, to: to}
	if name == ActionResolve {
		if !sagadef.IsTerminal(to) {
			return action{}, badRequest("resolve needs \"to\": one of %s, %s, %s", sagadef.StateCompleted, sagadef.StateFailed, sagadef.StateCancelled)
		}
	} else if to != "" {
		return action{}, badRequest("\"to\" is only for resolve")
	}
	return a, nil
}

func (s *Server) handleAction(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id, err := parseSagaID(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req ActionRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	a, err := parseAction(r.PathValue("action"), req.Reason, req.To)
	if err != nil {
		return err
	}
	switch {
	case req.ExpectedVersion == 0:
		return badRequest("expected_version is required: the version you decided on (from GET /api/sagas/%s)", id)
	case req.ExpectedVersion < 0:
		return badRequest("expected_version=%d: versions start at 1", req.ExpectedVersion)
	}
	t, _, err := s.find(r.Context(), id, req.Type)
	if err != nil {
		return err
	}
	res, err := s.operate(r.Context(), principalOf(r.Context()), t, id, a, req.ExpectedVersion)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// operate applies a to saga id of type t through the engine's version-guarded,
// audited operator action, in one transaction that first locks the saga row.
//
// It is idempotent: when the saga already is in the action's target state
// (cancel, resolve), or when its audit trail shows this principal already
// applied this action from expectedVersion (a retried request whose answer
// was lost), it returns OutcomeAlreadyApplied and changes nothing. Any other
// version mismatch is a 409 version_conflict.
func (s *Server) operate(ctx context.Context, p Principal, t *sagaType, id string, a action, expectedVersion int64) (ActionResult, error) {
	res := ActionResult{Action: a.name}
	// In the engine's transaction, as saga.Engine.Operate: the action is
	// counted in the metrics and its commands are announced to relays only
	// once it has committed.
	err := t.engine.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		locked, err := t.engine.StatusTx(ctx, tx, id)
		if errors.Is(err, saga.ErrNotFound) {
			return apiErr(http.StatusNotFound, "not_found", "no saga %s of type %s", id, t.def.Name)
		}
		if err != nil {
			return fmt.Errorf("lock saga %s: %w", id, err)
		}
		w := rowOf(locked)
		if tg := a.target(); tg != "" && w.State == tg {
			res.Outcome, res.Saga = OutcomeAlreadyApplied, t.view(w, s.cfg.Now())
			return nil
		}
		if w.Version != expectedVersion {
			var repeat bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM saga_audit
WHERE saga_id = $1::uuid AND trigger = $2 AND operator = $3 AND version = $4 AND class = 'new')`,
				id, a.trigger, p.Name, expectedVersion+1).Scan(&repeat); err != nil {
				return fmt.Errorf("check for a repeated %s of saga %s: %w", a.name, id, err)
			}
			if repeat {
				res.Outcome, res.Saga = OutcomeAlreadyApplied, t.view(w, s.cfg.Now())
				return nil
			}
			return conflict(id, expectedVersion, w.Version, w.State)
		}
		st, err := t.engine.OperateTx(ctx, tx, saga.Operation{Trigger: a.trigger, SagaID: id, ExpectedVersion: expectedVersion,
			Operator: p.Name, Reason: a.reason, ResolveTo: a.to})
		if err != nil {
			return operateError(err, id)
		}
		res.Outcome, res.Saga = OutcomeApplied, t.view(rowOf(st), s.cfg.Now())
		return nil
	})
	if err != nil {
		return ActionResult{}, err
	}
	s.cfg.Logger.InfoContext(ctx, "admin repair", "operator", p.Name, "reason", a.reason, "action", a.name,
		"saga_type", t.def.Name, "saga_id", id, "outcome", res.Outcome, "state", res.Saga.State, "version", res.Saga.Version)
	return res, nil
}

func conflict(id string, expected, actual int64, state string) *apiError {
	return &apiError{status: http.StatusConflict, body: Error{Code: "version_conflict",
		Message: fmt.Sprintf("saga %s changed since you looked: you decided on version %d, it is at version %d in state %s; reload and decide again", id, expected, actual, state),
		Detail:  map[string]any{"expected_version": expected, "actual_version": actual, "state": state}}}
}

// operateError maps the engine's errors to API errors.
func operateError(err error, id string) error {
	var vc *saga.VersionConflictError
	var rj *saga.RejectedError
	switch {
	case errors.As(err, &vc):
		return conflict(id, vc.Expected, vc.Actual, vc.State)
	case errors.As(err, &rj):
		return &apiError{status: http.StatusConflict, body: Error{Code: "rejected",
			Message: fmt.Sprintf("the saga's state machine refuses %s in state %s: %v", rj.Trigger, rj.State, rj.Err),
			Detail:  map[string]any{"state": rj.State, "trigger": rj.Trigger}}}
	case errors.Is(err, saga.ErrNotFound):
		return apiErr(http.StatusNotFound, "not_found", "no saga %s", id)
	}
	return err
}

func (s *Server) handleBulk(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	var req BulkRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	a, err := parseAction(r.PathValue("action"), req.Reason, req.To)
	if err != nil {
		return err
	}
	n, err := bulkMax(req.Max)
	if err != nil {
		return err
	}
	f := req.Filter
	if f == (SagaFilter{}) {
		return badRequest("filter: name at least one of type, state, business_key, key_prefix, stuck, review, created_after, created_before, updated_after, updated_before")
	}
	types, err := s.scope(f)
	if err != nil {
		return err
	}
	ctx := r.Context()
	items, more, err := s.list(ctx, types, f, false, n, "")
	if err != nil {
		return err
	}
	p := principalOf(ctx)
	out := BulkResult{Action: a.name, DryRun: req.DryRun, Truncated: more, Items: []BulkItem{}, Counts: map[string]int{}}
	for _, it := range items {
		item := BulkItem{SagaID: it.w.ID, Type: it.t.def.Name, BusinessKey: it.w.BusinessKey, State: it.w.State, Version: it.w.Version}
		if req.DryRun {
			pr := s.predict(ctx, it.t, it.w, a, p)
			item.Outcome, item.To, item.Sends, item.Effect, item.Error = pr.Outcome, pr.To, pr.Sends, pr.Effect, pr.Error
		} else {
			res, err := s.operate(ctx, p, it.t, it.w.ID, a, it.w.Version)
			var ae *apiError
			switch {
			case err == nil:
				item.Outcome, item.To = res.Outcome, res.Saga.State
			case errors.As(err, &ae):
				item.Outcome, item.Error = ae.body.Code, ae.body.Message
			default:
				s.cfg.Logger.ErrorContext(ctx, "bulk repair item failed", "saga_id", it.w.ID, "action", a.name, "error", err)
				item.Outcome, item.Error = OutcomeError, errorText(err)
			}
		}
		out.Counts[item.Outcome]++
		out.Items = append(out.Items, item)
	}
	s.cfg.Logger.InfoContext(ctx, "admin bulk repair", "operator", p.Name, "reason", a.reason, "action", a.name,
		"dry_run", req.DryRun, "counts", out.Counts)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// predict says what a would do to the saga in row w, without doing it:
// the state machine decides on the instance as it is now (judge), with
// the state it would reach and the messages it would send.
func (s *Server) predict(ctx context.Context, t *sagaType, w sagaRow, a action, p Principal) BulkItem {
	item := BulkItem{}
	if tg := a.target(); tg != "" && w.State == tg {
		item.Outcome, item.To = OutcomeAlreadyApplied, tg
		item.Effect = "nothing: the saga already is in " + tg
		return item
	}
	st, err := t.engine.Status(ctx, w.ID)
	if err != nil {
		item.Outcome, item.Error = OutcomeError, errorText(operateError(err, w.ID))
		return item
	}
	v := s.judge(ctx, t, st, a, p)
	if !v.allowed {
		item.Outcome, item.Error = OutcomeWouldReject, v.refusal
		return item
	}
	item.Outcome, item.To, item.Sends, item.Effect = OutcomeWouldApply, v.reaches, v.sends, v.effect
	return item
}
