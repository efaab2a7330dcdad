package sagadef

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/protosaga/saga/runtime/message"
)

// CancelRequest returns who asked for a cancel and why: the values of the
// cancel message's RequestedBy and Reason fields (Definition.Cancel). A
// field path the message does not have, or an unset field, gives "". A
// string is returned as it is, any other scalar in its text form (an enum
// by its value name).
func (d *Definition) CancelRequest(m message.Message) (requestedBy, reason string) {
	if m == nil {
		return "", ""
	}
	r := m.ProtoReflect()
	return fieldText(r, d.Cancel.RequestedBy), fieldText(r, d.Cancel.Reason)
}

// fieldText returns the text of the scalar at path (field names joined
// with dots) in m, or "" when there is none.
func fieldText(m protoreflect.Message, path string) string {
	if path == "" || m == nil || !m.IsValid() {
		return ""
	}
	parts := strings.Split(path, ".")
	for i, name := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.IsList() || fd.IsMap() {
			return ""
		}
		if i < len(parts)-1 {
			if fd.Message() == nil || !m.Has(fd) {
				return ""
			}
			m = m.Get(fd).Message()
			continue
		}
		v := m.Get(fd)
		switch fd.Kind() {
		case protoreflect.StringKind:
			return strings.TrimSpace(v.String())
		case protoreflect.EnumKind:
			if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
				return string(ev.Name())
			}
			return fmt.Sprint(int32(v.Enum()))
		case protoreflect.MessageKind, protoreflect.GroupKind, protoreflect.BytesKind:
			return ""
		default:
			return fmt.Sprint(v.Interface())
		}
	}
	return ""
}

// onCancel applies the business cancel message (Definition.Cancel). Waiting
// on a compensatable step or the pivot, the saga stops waiting, records the
// cancel and compensates as after a business failure, ending CANCELLED.
// Everywhere else it changes nothing and says why in the audit note.
func (w *work) onCancel() error {
	by, why := w.cancelRequest()
	who := fmt.Sprintf("cancel requested by %s (%s)", orUnknown(by), orUnknown(why))
	st := w.state()
	switch st.Kind {
	case StateKindTerminal:
		if st.Name == StateCompleted && w.d.CompensableAfterCompletion() {
			w.class = ClassNew
			if err := w.fold(); err != nil {
				return err
			}
			w.progress().Cancel = &Cancellation{RequestedBy: by, Reason: why, MessageID: w.trig.MessageID}
			w.note("%s after the saga completed; compensating its steps in reverse", who)
			return w.compensate()
		}
		w.noop(ClassLate, "%s ignored: the saga already ended %s", who, st.Name)
		return nil
	case StateKindCompensating:
		w.noop(ClassLate, "%s ignored: the saga is already compensating (step %s)", who, st.Step)
		return nil
	case StateKindManualReview:
		if c := w.in.Progress.Cancel; c != nil {
			w.noop(ClassLate, "%s ignored: the saga in manual review already holds the cancel requested by %s (%s)",
				who, orUnknown(c.RequestedBy), orUnknown(c.Reason))
			return nil
		}
		// The state stays: an operator decides. The request is recorded
		// for that operator (Progress.Cancel, the timeline), and a
		// compensation the operator starts then ends CANCELLED, answering
		// a parent that asked with its cancelled reply.
		w.class = ClassLate
		if err := w.fold(); err != nil {
			return err
		}
		w.progress().Cancel = &Cancellation{RequestedBy: by, Reason: why, MessageID: w.trig.MessageID}
		w.note("%s while the saga is in manual review: recorded, the state unchanged; an operator decides "+
			"(compensate: the saga then ends %s; retry drops the request; or resolve)", who, StateCancelled)
		return nil
	}
	at, what := w.stepIndex(st.Step), "step "+st.Step
	if st.Kind == StateKindGroup {
		at, what = w.d.compiled.groups[st.Group].first, "group "+st.Group
	}
	if passed := w.pointOfNoReturn(at); passed != "" {
		w.noop(ClassLate, "%s refused: %s, past the point of no return; the saga runs to completion", who, passed)
		return nil
	}
	w.class = ClassNew
	if err := w.fold(); err != nil {
		return err
	}
	w.progress().Cancel = &Cancellation{RequestedBy: by, Reason: why, MessageID: w.trig.MessageID}
	w.note("%s while waiting on %s; compensating", who, what)
	if st.Kind == StateKindGroup {
		w.stopGroup()
	} else {
		w.stop(st.Step)
	}
	return w.compensate()
}

// pointOfNoReturn says how the saga, waiting on step i, is past its point
// of no return (waiting on a retriable step, or a pivot or retriable step
// completed), or returns "" when it is not.
func (w *work) pointOfNoReturn(i int) string {
	for _, name := range w.in.Progress.Completed {
		if j, ok := w.d.compiled.steps[name]; ok && w.step(j).Role != RoleCompensatable && w.step(j).Role != RoleCheck {
			return fmt.Sprintf("%s step %s completed", w.step(j).Role, name)
		}
	}
	if s := w.step(i); s.Role == RoleRetriable {
		return fmt.Sprintf("it waits on retriable step %s", s.Name)
	}
	return ""
}

// cancelRequest returns who asked for the cancel and why: the trigger's
// Operator and Reason when set, otherwise the cancel message's fields.
func (w *work) cancelRequest() (by, why string) {
	by, why = strings.TrimSpace(w.trig.Operator), w.reason() // every cancel note says why
	if by == "" || why == "" {
		mb, mw := w.d.CancelRequest(w.trig.Message)
		if by == "" {
			by = mb
		}
		if why == "" {
			why = mw
		}
	}
	return by, why
}

func orUnknown(s string) string {
	if s == "" {
		return "(not given)"
	}
	return s
}
