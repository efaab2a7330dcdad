package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// FireTimeouts applies due timeouts and deadlines to at most limit instances
// in one transaction and returns how many it applied.
//
// It claims due instances with SELECT ... FOR UPDATE SKIP LOCKED, so several
// scanners (in one process or many) never work on the same instance at once,
// and an instance a reply is being applied to is skipped until that
// transaction ends. A claimed row is current: if a reply moved it on before
// the claim, PostgreSQL re-checks the due condition against the new row and
// drops it. Each instance gets [sagadef.TriggerDeadline] when its deadline has
// passed, otherwise [sagadef.TriggerTimeout]; the transition is persisted,
// its messages written to the outbox and audited exactly like a reply's.
//
// An instance whose transition fails (a hook error) is rolled back to a
// savepoint, gets the error in last_error and is left alone for
// Config.FailureBackoff; the others in the batch still commit. After
// Config.MaxDeferrals such failures in a row, the instance goes to manual
// review instead ([sagadef.TriggerStuck]), with the last error as the
// reason.
func (e *Engine) FireTimeouts(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = e.cfg.TimeoutBatch
	}
	fired := 0
	var wakes *txq.Wakes
	err := pgx.BeginFunc(ctx, e.cfg.Pool, func(tx pgx.Tx) error {
		fired = 0
		wakes = txq.NewWakes(tx)
		wakes.HandOffTo(e.handOff())
		stx := txq.New(tx, wakes, nil)
		now := e.cfg.Now()
		rows, err := tx.Query(ctx, e.q.claimDue, now, limit, e.clocked)
		if err != nil {
			return fmt.Errorf("claim due saga %s instances: %w", e.def.Name, err)
		}
		due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) { return scanRow(r) })
		if err != nil {
			return fmt.Errorf("claim due saga %s instances: %w", e.def.Name, err)
		}
		for _, w := range due {
			ok, err := e.fireOne(ctx, stx, w, now)
			if err != nil {
				return err
			}
			if ok {
				fired++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	wakes.Notify(ctx, e.cfg.Pool, e.cfg.Logger.With("saga_type", e.def.Name))
	return fired, nil
}

// fireOne applies the due trigger to one claimed row under a savepoint. It
// returns false (and a nil error) when the instance's transition failed and
// was rolled back and deferred. The transition's writes go out through a
// scope that commits with tx's wake set, so its metrics are recorded only
// once the scan's transaction has committed: a scan whose commit fails is
// counted by the next one only.
func (e *Engine) fireOne(ctx context.Context, tx *txq.Tx, w row, now time.Time) (bool, error) {
	kind := sagadef.TriggerTimeout
	if w.DeadlineAt != nil && !w.DeadlineAt.After(now) {
		kind = sagadef.TriggerDeadline
	}
	trig := sagadef.Trigger{Kind: kind}
	if n := deferrals(w); e.cfg.MaxDeferrals >= 0 && n >= e.cfg.MaxDeferrals {
		trig = sagadef.Trigger{Kind: sagadef.TriggerStuck,
			Reason: fmt.Sprintf("the scanner could not apply its due timeout or deadline %d times in a row; last error: %s", n, w.LastError)}
		kind = trig.Kind
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("savepoint for saga %s: %w", w.ID, err)
	}
	var out outcome
	terr := txq.Run(ctx, sp, func(ctx context.Context, sp pgx.Tx) error {
		var err error
		out, err = e.transition(ctx, sp, w, trig, origin{Link: e.pendingTrace(ctx, sp, w), Flush: true})
		return err
	})
	if terr == nil && e.stillDue(out.Result.Instance, now) {
		// A transition that leaves the instance due would be claimed
		// again by the next scan, forever: keep it, but defer it.
		terr = errors.New("transition left the instance due; deferred")
		if cerr := sp.Commit(ctx); cerr != nil {
			return false, fmt.Errorf("release savepoint for saga %s: %w", w.ID, cerr)
		}
		return true, e.deferDue(ctx, tx, w, kind, terr, now)
	}
	if terr != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return false, fmt.Errorf("roll back savepoint for saga %s: %w (after %v)", w.ID, rerr, terr)
		}
		if ctx.Err() != nil {
			return false, terr
		}
		if errors.Is(terr, ErrVersionConflict) {
			// Someone else moved the instance on: nothing is wrong with
			// it, and whatever is due now is the next scan's business.
			e.cfg.Logger.DebugContext(ctx, "saga "+kind+" skipped: instance moved on", "saga_type", e.def.Name, "saga_id", w.ID)
			return false, nil
		}
		return false, e.deferDue(ctx, tx, w, kind, terr, now)
	}
	if err := sp.Commit(ctx); err != nil {
		return false, fmt.Errorf("release savepoint for saga %s: %w", w.ID, err)
	}
	e.cfg.Logger.InfoContext(ctx, "saga "+kind+" fired", "saga_type", e.def.Name, "saga_id", w.ID,
		"class", out.Result.Class.String(), "from", w.State, "to", out.Result.Instance.State, "version", out.Version)
	return true, nil
}

// deferrals is how many times in a row the scanner deferred w (see
// Config.MaxDeferrals); unreadable progress counts as none (the transition
// reports it).
func deferrals(w row) int {
	var p struct {
		Deferrals int `json:"deferrals"`
	}
	_ = json.Unmarshal(w.Progress, &p)
	return p.Deferrals
}

func (e *Engine) stillDue(inst sagadef.Instance, now time.Time) bool {
	if e.stateKind[inst.State] == sagadef.StateKindTerminal || e.stateKind[inst.State] == sagadef.StateKindManualReview {
		return false
	}
	return (!inst.TimeoutAt.IsZero() && !inst.TimeoutAt.After(now)) ||
		(!inst.DeadlineAt.IsZero() && !inst.DeadlineAt.After(now))
}

func (e *Engine) deferDue(ctx context.Context, tx pgx.Tx, w row, kind string, cause error, now time.Time) error {
	e.cfg.Logger.ErrorContext(ctx, "saga "+kind+" failed; deferred", "saga_type", e.def.Name, "saga_id", w.ID,
		"state", w.State, "retry_after", e.cfg.FailureBackoff, "error", cause)
	// The count is the claimed row's plus one, whether the transition was
	// rolled back or applied and left the instance due (which reset the
	// stored count): a transition that keeps leaving it due is stuck too.
	if _, err := tx.Exec(ctx, e.q.deferDue, w.ID, fmt.Sprintf("%s: %v", kind, cause), now.Add(e.cfg.FailureBackoff), deferrals(w)+1); err != nil {
		return fmt.Errorf("defer %s of saga %s: %w", kind, w.ID, err)
	}
	return nil
}

// RunTimeouts runs the timeout scanner until ctx is done: it calls
// [Engine.FireTimeouts] every interval, and again at once while batches come
// back full. Errors are logged and retried at the next tick. Any number of
// scanners may run against one database. It returns nil when ctx is
// cancelled.
func (e *Engine) RunTimeouts(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("saga %s timeout scanner: interval must be positive, got %s", e.def.Name, every)
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := e.FireTimeouts(ctx, e.cfg.TimeoutBatch)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			e.cfg.Logger.ErrorContext(ctx, "saga timeout scan failed", "saga_type", e.def.Name, "error", err)
			t.Reset(every)
		case n >= e.cfg.TimeoutBatch:
			t.Reset(0)
		default:
			t.Reset(every)
		}
	}
}

// pendingTrace is the trace of the command w waits for a reply to, read
// from its outbox row, so that a timeout's span (the root of a new trace)
// links to it; invalid when tracing is off, nothing is pending or the row
// is gone. A failure to read it costs only the link.
func (e *Engine) pendingTrace(ctx context.Context, tx pgx.Tx, w row) trace.SpanContext {
	if e.tel.tracer == nil || w.PendingID == "" {
		return trace.SpanContext{}
	}
	parent, state, ok, err := outbox.Trace(ctx, tx, w.PendingID)
	if err != nil {
		e.cfg.Logger.DebugContext(ctx, "timeout: could not read the pending command's trace context",
			"saga_type", e.def.Name, "saga_id", w.ID, "message_id", w.PendingID, "error", err)
	}
	if !ok {
		return trace.SpanContext{}
	}
	return telemetry.ParseSpanContext(parent, state)
}
