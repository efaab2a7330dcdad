package admin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/saga"
)

// TriggerDismiss is the audit trigger of a parked copy's dismissal (a
// saga_audit row without state change, written with the operator and
// reason).
const TriggerDismiss = "operator.dismiss"

func (s *Server) handleDismiss(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id, err := parseParkedID(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req DismissRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	res, err := s.dismiss(r.Context(), principalOf(r.Context()), id, reason, req.DryRun, req.Force)
	if err != nil {
		return err
	}
	if res.Outcome == OutcomeRefused {
		return &apiError{status: http.StatusConflict, body: Error{Code: "refused", Message: "dismissal refused: " + res.Explanation, Detail: res}}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *Server) handleBulkDismiss(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	var req BulkDismissRequest
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
	if err := bulkFilter(req.Filter, "dismiss"); err != nil {
		return err
	}
	ctx := r.Context()
	rows, err := s.listParked(ctx, req.Filter, parked.OldestFirst, 0, n+1)
	if err != nil {
		return err
	}
	out := BulkDismissResult{DryRun: req.DryRun, Counts: map[string]int{}, Items: []DismissResult{}}
	if len(rows) > n {
		rows, out.Truncated = rows[:n], true
	}
	p := principalOf(ctx)
	for _, row := range rows {
		res, err := s.dismiss(ctx, p, row.ID, reason, req.DryRun, false)
		if err != nil {
			s.cfg.Logger.ErrorContext(ctx, "bulk dismissal item failed", "parked_id", row.ID, "error", err)
			res = DismissResult{Outcome: OutcomeError, Parked: row.Parked, Explanation: errorText(err)}
		}
		out.Counts[res.Outcome]++
		out.Items = append(out.Items, res)
	}
	s.cfg.Logger.InfoContext(ctx, "admin bulk dismissal", "operator", p.Name, "reason", reason, "dry_run", req.DryRun, "counts", out.Counts)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// dismiss closes parked row id without replaying it, in one transaction
// that locks the row (and its saga's row, so the standing it decided on
// still holds at the commit), records who, when and why on it, and writes a
// TriggerDismiss row in the saga's audit trail. A copy that is still
// current (its saga waits for it) is refused unless force is set: the saga
// would wait until its step's timeout. A closed row is left as it is
// (OutcomeAlreadyClosed).
func (s *Server) dismiss(ctx context.Context, p Principal, id int64, reason string, dryRun, force bool) (DismissResult, error) {
	var (
		res    DismissResult
		sagaID string
		forced bool
	)
	err := txq.Do(ctx, s.cfg.Pool, s.cfg.Logger, nil, func(ctx context.Context, tx pgx.Tx) error {
		res, sagaID, forced = DismissResult{}, "", false
		row, err := s.loadParked(ctx, tx, id, !dryRun)
		if err != nil {
			return err
		}
		ps := []parkedRow{row}
		if err := s.join(ctx, ps); err != nil {
			return err
		}
		row = ps[0]
		res.Parked = row.Parked
		switch {
		case row.ReplayedAt != nil:
			res.Outcome = OutcomeAlreadyClosed
			res.Explanation = fmt.Sprintf("replayed at %s by %s", row.ReplayedAt.Format(time.RFC3339), row.ReplayedBy)
			return nil
		case row.DismissedAt != nil:
			res.Outcome = OutcomeAlreadyClosed
			res.Explanation = fmt.Sprintf("dismissed at %s by %s", row.DismissedAt.Format(time.RFC3339), row.DismissedBy)
			return nil
		}
		var lockTx pgx.Tx
		if !dryRun {
			lockTx = tx
		}
		standing, note, err := s.standing(ctx, lockTx, row)
		if err != nil {
			return err
		}
		res.Parked.Standing, res.Parked.StandingNote = standing, note
		forced = standing == StandingCurrent
		if forced && !force {
			res.Outcome = OutcomeRefused
			res.Explanation = "it is the current copy: " + note + "; replay it, or retry the saga and dismiss this copy then"
			return nil
		}
		res.Explanation = note
		if forced {
			res.Explanation = "FORCED: it was the current copy (" + note + "); its saga waits until its step's timeout"
		}
		if dryRun {
			res.Outcome = OutcomeWouldDismiss
			return nil
		}
		now := s.cfg.Now().UTC()
		if err := parked.MarkDismissed(ctx, tx, id, now, p.Name, reason); err != nil {
			return fmt.Errorf("dismiss parked message %d: %w", id, err)
		}
		if t, ok := s.byName[row.SagaType]; ok && standing != "" {
			detail := fmt.Sprintf("dismissed parked message %d (%s) from queue %s; %s", id, short(row.MessageType), row.Queue, res.Explanation)
			if _, err := t.engine.NoteTx(ctx, tx, saga.Note{SagaID: row.SagaID, Trigger: TriggerDismiss, MessageID: row.MessageID,
				Operator: p.Name, Reason: reason, Detail: detail}); err != nil {
				return fmt.Errorf("audit dismissal of parked message %d: %w", id, err)
			}
			sagaID = row.SagaID
		}
		res.Outcome = OutcomeDismissed
		res.Parked.DismissedAt, res.Parked.DismissedBy, res.Parked.DismissReason = &now, p.Name, reason
		res.Parked.Standing, res.Parked.StandingNote = "", ""
		return nil
	})
	if err != nil {
		return DismissResult{}, err
	}
	if res.Outcome == OutcomeDismissed {
		s.cfg.Logger.InfoContext(ctx, "admin dismissed parked message", "operator", p.Name, "reason", reason,
			"parked_id", id, "message_id", res.Parked.MessageID, "saga_id", sagaID, "forced", forced)
	}
	return res, nil
}
