package sagadef

import (
	"fmt"
	"slices"
	"strings"
)

func (w *work) onOperator() error {
	t := w.trig
	if strings.TrimSpace(t.Operator) == "" || strings.TrimSpace(t.Reason) == "" {
		return fmt.Errorf("operator triggers need an operator and a reason: %w", ErrInvalidTrigger)
	}
	if t.ResolveTo != "" && w.kind != TriggerOperatorResolve {
		return fmt.Errorf("ResolveTo is only for %s: %w", TriggerOperatorResolve, ErrInvalidTrigger)
	}
	st := w.state()
	if st.Kind == StateKindTerminal {
		return fmt.Errorf("%s: %w", st.Name, ErrTerminal)
	}
	w.class = ClassNew
	w.note("%s by %s: %s", w.kind, t.Operator, w.reason())
	switch w.kind {
	case TriggerOperatorRetry:
		return w.operatorRetry(st)
	case TriggerOperatorCompensate:
		return w.operatorCompensate(st)
	case TriggerOperatorResolve:
		if st.Kind != StateKindManualReview {
			return fmt.Errorf("resolve applies to %s only; use cancel or compensate: %w", StateManualReview, ErrInvalidTrigger)
		}
		if !IsTerminal(t.ResolveTo) {
			return fmt.Errorf("resolve to %q: want %s, %s or %s: %w",
				t.ResolveTo, StateCompleted, StateFailed, StateCancelled, ErrInvalidTrigger)
		}
		w.stopReviewStep()
		w.finish(t.ResolveTo)
		return nil
	default: // cancel
		switch st.Kind {
		case StateKindStep:
			w.stop(st.Step)
		case StateKindGroup:
			w.stopGroup()
		case StateKindManualReview:
			w.stopReviewStep()
		}
		w.finish(StateCancelled)
		return nil
	}
}

// reviewState returns the state the saga entered manual review from.
func (w *work) reviewState() (State, bool) {
	s, ok := w.d.compiled.states[w.in.Progress.ReviewFrom]
	return s, ok
}

// stopReviewStep marks the step the saga was waiting on when it entered
// manual review as stopped, when the review ends without resuming it.
func (w *work) stopReviewStep() {
	if rs, ok := w.reviewState(); ok && rs.Kind == StateKindStep {
		w.stop(rs.Step)
	}
	w.stopGroup()
}

// isSuccess reports whether reply is a success reply of its step.
func (w *work) isSuccess(reply string) bool {
	return w.d.compiled.messages[reply].use == UseSuccess
}

func (w *work) operatorRetry(st State) error {
	switch st.Kind {
	case StateKindStep:
		return w.enterStep(w.stepIndex(st.Step), 1)
	case StateKindGroup:
		return w.enterGroup(st.Group)
	case StateKindCompensating:
		return w.enterCompensation(w.stepIndex(st.Step), 1)
	}
	rs, ok := w.reviewState()
	p := w.progress()
	switch {
	case ok && rs.Kind == StateKindGroup:
		return w.retryGroupFromReview(rs.Group)
	case ok && rs.Kind == StateKindStep:
		i := w.stepIndex(rs.Step)
		if rec, settled := p.Outcomes[rs.Step]; settled {
			if w.isSuccess(rec) {
				if !slices.Contains(p.Completed, rs.Step) {
					p.Completed = append(p.Completed, rs.Step)
				}
				w.note("step %s succeeded with %s while in review; continuing", rs.Step, shortName(rec))
				return w.advance(i)
			}
			delete(p.Outcomes, rs.Step)
			w.retriedAfterFailure(w.step(i).Command)
			w.note("retrying step %s despite %s", rs.Step, shortName(rec))
		}
		return w.enterStep(i, 1)
	case ok && rs.Kind == StateKindCompensating:
		i := w.stepIndex(rs.Step)
		if rec, settled := p.CompensationOutcomes[rs.Step]; settled {
			if rec == w.step(i).CompensationReply {
				if !slices.Contains(p.Compensated, rs.Step) {
					p.Compensated = append(p.Compensated, rs.Step)
				}
				w.note("compensation of step %s succeeded while in review; continuing", rs.Step)
				return w.compensate()
			}
			delete(p.CompensationOutcomes, rs.Step)
			w.retriedAfterFailure(w.step(i).Compensation)
			w.note("retrying the compensation of step %s despite %s", rs.Step, shortName(rec))
		}
		return w.enterCompensation(i, 1)
	}
	from := w.in.Progress.ReviewFrom
	if from == "" {
		from = "an unknown state"
	}
	return fmt.Errorf("nothing to retry: the saga entered manual review from %s; resolve, compensate or cancel it: %w",
		from, ErrInvalidTrigger)
}

// retriedAfterFailure counts an operator retry of command after its
// recorded failure (see Progress.OperatorRetries).
func (w *work) retriedAfterFailure(command string) {
	if command == "" {
		return // an external step sends nothing
	}
	p := w.progress()
	if p.OperatorRetries == nil {
		p.OperatorRetries = map[string]int{}
	}
	p.OperatorRetries[command]++
}

func (w *work) operatorCompensate(st State) error {
	p := w.progress()
	switch st.Kind {
	case StateKindCompensating:
		return fmt.Errorf("already compensating step %s; use retry to resend: %w", st.Step, ErrInvalidTrigger)
	case StateKindStep:
		w.stop(st.Step)
		return w.compensate()
	case StateKindGroup:
		w.stopGroup()
		return w.compensate()
	}
	if rs, ok := w.reviewState(); ok {
		switch rs.Kind {
		case StateKindGroup:
			w.completeRecorded(rs.Group)
			w.stopGroup()
		case StateKindStep:
			if rec, settled := p.Outcomes[rs.Step]; settled {
				if w.isSuccess(rec) && !slices.Contains(p.Completed, rs.Step) {
					p.Completed = append(p.Completed, rs.Step)
				}
			} else {
				w.stop(rs.Step)
			}
		case StateKindCompensating:
			if rec, settled := p.CompensationOutcomes[rs.Step]; settled {
				if rec == w.step(w.stepIndex(rs.Step)).CompensationReply {
					if !slices.Contains(p.Compensated, rs.Step) {
						p.Compensated = append(p.Compensated, rs.Step)
					}
				} else {
					// Compensated again despite the recorded failure: as
					// a retry does (see retriedAfterFailure).
					delete(p.CompensationOutcomes, rs.Step)
					w.retriedAfterFailure(w.step(w.stepIndex(rs.Step)).Compensation)
				}
			}
		}
	}
	return w.compensate()
}
