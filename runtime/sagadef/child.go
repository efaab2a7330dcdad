package sagadef

import (
	"fmt"
	"slices"
)

// Replies names the replies a saga sends, as a child, to the parent saga
// whose step started it (Step.Child): the parent's step waits for them like
// for any participant's replies. The zero value declares none: the saga
// cannot be a child.
//
// A saga that declares Replies.Cancelled can be compensated after it
// completed: a cancel (Definition.Cancel) that finds it COMPLETED, with no
// pivot or retriable step completed, compensates its compensatable steps in
// reverse order and ends CANCELLED, so a parent's compensation undoes what
// the child did.
type Replies struct {
	// Completed, Failed and Cancelled are the full names of the replies
	// sent when an instance started by a parent ends COMPLETED, FAILED or
	// CANCELLED. Completed and Failed are required when any is set;
	// Cancelled when the saga declares a cancel.
	Completed string
	Failed    string
	Cancelled string
	// ManualReview is the full name of the reply that tells the parent the
	// instance entered manual review. Empty: the parent is not told.
	ManualReview string
}

// Declared reports whether r declares the replies of a child saga.
func (r Replies) Declared() bool { return r.Completed != "" }

// For returns the reply that reports reaching state ("" for none).
func (r Replies) For(state string) string {
	switch state {
	case StateCompleted:
		return r.Completed
	case StateFailed:
		return r.Failed
	case StateCancelled:
		return r.Cancelled
	case StateManualReview:
		return r.ManualReview
	}
	return ""
}

// Parent is the saga that started an instance from a child step, as the
// start command's envelope named it: the outcome replies are addressed to
// it as answers to that command (to the cancel, for the cancelled reply).
// Progress.Parent holds it; nil for an instance no parent started.
type Parent struct {
	SagaType      string `json:"saga_type"`
	SagaID        string `json:"saga_id"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// StartMessageID is the message id of the start command: the causation
	// id of the completed and failed replies.
	StartMessageID string `json:"start_message_id"`
	// CancelMessageID is the message id of the parent's cancel that the
	// instance applied: the causation id of the cancelled reply. Empty
	// while the parent has not cancelled it.
	CancelMessageID string `json:"cancel_message_id,omitempty"`
	// Traceparent and Tracestate continue the parent's trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// validateReplies checks r's shape against the definition; that each names
// a reply of the right package and fields is the generator's design review.
func (d *Definition) validateReplies() []string {
	r := d.Replies
	var problems []string
	if !r.Declared() {
		if r.Failed != "" || r.Cancelled != "" || r.ManualReview != "" {
			problems = append(problems, "replies name no completed reply")
		}
		return problems
	}
	if r.Failed == "" {
		problems = append(problems, "replies name no failed reply")
	}
	if d.Cancel.Message != "" && r.Cancelled == "" {
		problems = append(problems, fmt.Sprintf("replies name no cancelled reply, but the saga declares cancel %s: a parent that cancels it would never hear back", d.Cancel.Message))
	}
	if r.Cancelled != "" && d.Cancel.Message == "" {
		problems = append(problems, "replies name a cancelled reply, but the saga declares no cancel")
	}
	var seen []string
	for _, n := range []string{r.Completed, r.Failed, r.Cancelled, r.ManualReview} {
		if n == "" {
			continue
		}
		if !isFullName(n) {
			problems = append(problems, fmt.Sprintf("reply %q is not a valid proto full name", n))
			continue
		}
		if slices.Contains(seen, n) {
			problems = append(problems, fmt.Sprintf("reply %s names two outcomes", n))
		}
		seen = append(seen, n)
	}
	return problems
}

// CompensableAfterCompletion reports whether a cancel that finds the saga
// COMPLETED compensates it: the saga declares a cancel and a cancelled
// reply (it is a child a parent may compensate) and has neither a pivot nor
// retriable steps, so nothing it completed is past a point of no return.
func (d *Definition) CompensableAfterCompletion() bool {
	if d.Replies.Cancelled == "" || d.Cancel.Message == "" {
		return false
	}
	return !slices.ContainsFunc(d.Steps, func(s Step) bool { return s.Role == RolePivot || s.Role == RoleRetriable })
}

func cloneParent(p *Parent) *Parent {
	if p == nil {
		return nil
	}
	cp := *p
	return &cp
}

// ChildReview is what a parent recorded of its child in manual review
// (Progress.ChildReview): the step that waits on the child and the child's
// own account (its type, id and review reason). The step keeps waiting; the
// record goes when the saga leaves the step.
type ChildReview struct {
	Step   string `json:"step"`
	Reason string `json:"reason,omitempty"`
}

// onChildReview records the child's manual-review reply of step i: while
// the saga waits on the step for the child the reply names (its causation
// is a start the step sent), it folds the reply into the saga data and
// records it with the child's reason, the state unchanged; otherwise it
// only audits it.
func (w *work) onChildReview(i int) error {
	s := w.step(i)
	st := w.state()
	child := shortName(s.Child)
	why := orUnknown(w.reason())
	if st.Kind != StateKindStep || st.Step != s.Name || w.in.Progress.Sent[w.trig.CausationID] != s.Name {
		w.noop(ClassLate, "child %s of step %s in manual review (%s); the saga does not wait on it", child, s.Name, why)
		return nil
	}
	w.class = ClassLate
	if err := w.fold(); err != nil {
		return err
	}
	w.progress().ChildReview = &ChildReview{Step: s.Name, Reason: w.trig.Reason}
	w.note("child %s of step %s in manual review: %s; the step keeps waiting", child, s.Name, why)
	return nil
}

func cloneChildReview(r *ChildReview) *ChildReview {
	if r == nil {
		return nil
	}
	cp := *r
	return &cp
}
