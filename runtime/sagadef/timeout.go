package sagadef

import (
	"fmt"
	"time"
)

// due reports whether a timer armed at t has fired.
func (w *work) due(t time.Time) bool {
	return w.mode.assumeDue || !w.env.Now.Before(t)
}

func (w *work) onTimeout() error {
	at := w.in.TimeoutAt
	switch {
	case at.IsZero():
		w.noop(ClassLate, "stale timeout: no timeout armed")
		return nil
	case !w.due(at):
		w.noop(ClassLate, "stale timeout: next timeout due at %s", at.Format(time.RFC3339Nano))
		return nil
	}
	st := w.state()
	if st.Kind == StateKindGroup {
		return w.onGroupTimeout(st.Group)
	}
	if st.Kind != StateKindStep && st.Kind != StateKindCompensating {
		w.class = ClassLate
		w.out.TimeoutAt = time.Time{}
		w.note("timeout in state %s, which waits for no reply; cleared", st.Name)
		return nil
	}
	w.class = ClassNew
	i := w.stepIndex(st.Step)
	s := w.step(i)
	if st.Kind == StateKindCompensating {
		if w.in.Attempt < s.maxAttempts() {
			w.note("compensation of step %s unanswered after %s; resending", s.Name, s.Timeout)
			return w.enterCompensation(i, w.in.Attempt+1)
		}
		w.out.LastError = fmt.Sprintf("compensation of step %s unanswered after %d attempts", s.Name, w.in.Attempt)
		w.review(w.out.LastError)
		return nil
	}
	switch s.OnTimeout {
	case TimeoutCompensate:
		w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
		w.stop(s.Name)
		w.note("step %s timed out; compensating", s.Name)
		return w.compensate()
	case TimeoutRetry:
		if w.in.Attempt < s.maxAttempts() {
			w.note("step %s unanswered after %s; retrying", s.Name, s.Timeout)
			return w.enterStep(i, w.in.Attempt+1)
		}
		w.out.LastError = fmt.Sprintf("step %s: retry budget exhausted after %d attempts", s.Name, w.in.Attempt)
		w.review(w.out.LastError)
		return nil
	default:
		w.out.LastError = fmt.Sprintf("step %s timed out after %s", s.Name, s.Timeout)
		w.review(w.out.LastError)
		return nil
	}
}

func (w *work) onDeadline() {
	at := w.in.DeadlineAt
	switch {
	case at.IsZero():
		w.noop(ClassLate, "stale deadline: no deadline armed")
		return
	case !w.due(at):
		w.noop(ClassLate, "stale deadline: due at %s", at.Format(time.RFC3339Nano))
		return
	}
	w.out.DeadlineAt = time.Time{}
	switch w.state().Kind {
	case StateKindStep, StateKindGroup, StateKindManualReview:
		w.class = ClassNew
		w.out.LastError = fmt.Sprintf("deadline exceeded (%s)", w.d.Deadline)
		w.review(w.out.LastError)
	default:
		w.class = ClassLate
		w.note("deadline passed in state %s, which it no longer bounds; cleared", w.in.State)
	}
}

// onStuck sends a saga whose due timeout or deadline kept failing to manual
// review, with its deadline cleared too (unlike review, which keeps it): the
// scanner has nothing left to do for it.
func (w *work) onStuck() {
	switch w.state().Kind {
	case StateKindStep, StateKindGroup, StateKindCompensating:
		w.class = ClassNew
		reason := w.reason()
		if reason == "" {
			reason = "its due timeout or deadline could not be applied"
		}
		w.out.DeadlineAt = time.Time{}
		w.review(reason)
	default:
		w.noop(ClassLate, "stuck in state %s, which no clock acts on; nothing to do", w.in.State)
	}
}
