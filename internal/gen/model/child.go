package model

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// Source path field numbers of child sagas.
const (
	sagaReplies = 11
	stepChild   = 16

	repliesCompleted    = 1
	repliesFailed       = 2
	repliesCancelled    = 3
	repliesManualReview = 4
)

// Replies are the replies a saga sends, as a child, to the parent saga
// whose step started it.
type Replies struct {
	Completed *Message
	Failed    *Message
	// Cancelled is nil when the saga declares no cancel.
	Cancelled *Message
	// ManualReview is nil when the saga does not tell its parent.
	ManualReview *Message
}

// replies reviews a saga's replies declaration (rule saga-replies): each
// names a reply with a correlation field that the saga data also has (same
// name), so the runtime can fill it; cancelled is there exactly when the
// saga declares a cancel.
func (b *builder) replies(f *protogen.File, base []int32, pkg protoreflect.FullName, s *Saga, o *sagav1.Replies) *Replies {
	r := &Replies{}
	for _, x := range []struct {
		field int32
		name  string
		value string
		set   func(*Message)
	}{
		{repliesCompleted, "completed", o.GetCompleted(), func(m *Message) { r.Completed = m }},
		{repliesFailed, "failed", o.GetFailed(), func(m *Message) { r.Failed = m }},
		{repliesCancelled, "cancelled", o.GetCancelled(), func(m *Message) { r.Cancelled = m }},
		{repliesManualReview, "manual_review", o.GetManualReview(), func(m *Message) { r.ManualReview = m }},
	} {
		p := path(base, x.field)
		switch {
		case x.value == "" && x.name == "cancelled" && s.Cancel != nil:
			b.errorf(f, base, "saga-replies", "add cancelled: \"<reply>\"; a parent that compensates the saga cancels it and waits for this reply",
				"saga %s: replies name no cancelled reply, but the saga declares a cancel", s.FullName)
		case x.value == "" && (x.name == "cancelled" || x.name == "manual_review"):
		case x.value == "":
			b.errorf(f, base, "saga-replies", "add "+x.name+": \"<reply>\"; a parent waits for every outcome of its child",
				"saga %s: replies name no %s reply", s.FullName, x.name)
		case x.name == "cancelled" && s.Cancel == nil:
			b.errorf(f, p, "saga-replies", "declare cancel: {...} on the saga, or remove cancelled",
				"saga %s: replies name a cancelled reply, but the saga declares no cancel, so it can never be cancelled", s.FullName)
		default:
			m := b.refAs("saga-replies", f, p, pkg, "saga "+s.FullName+": ", x.value, sagav1.Kind_KIND_REPLY, "replies "+x.name)
			if m == nil {
				continue
			}
			if part := s.part(m); part != "" {
				b.errorf(f, p, "saga-replies", "answer the parent with a reply of its own",
					"saga %s: replies %s %s is already the %s", s.FullName, x.name, m.FullName, part)
				continue
			}
			if m.Correlation != nil && s.Data != nil && s.Data.Desc.Fields().ByName(protoreflect.Name(m.Correlation.Fields[0].Desc.Name())) == nil {
				b.errorf(f, p, "saga-replies", fmt.Sprintf("add a field %q to %s (the runtime copies the reply's fields from the saga data by name), or correlate the reply on a field the data has", m.Correlation.Fields[0].Desc.Name(), s.Data.Desc.FullName()),
					"saga %s: replies %s %s correlates on %q, which the saga data %s does not have: the reply would go out without it", s.FullName, x.name, m.FullName, m.Correlation.Path, s.Data.Desc.FullName())
			}
			b.replyFieldsFilled(f, p, s, x.name, m)
			x.set(m)
		}
	}
	seen := map[*Message]bool{}
	twice := false
	for _, m := range []*Message{r.Completed, r.Failed, r.Cancelled, r.ManualReview} {
		twice = twice || m != nil && seen[m]
		seen[m] = true
	}
	if twice {
		b.errorf(f, base, "saga-replies", "give each outcome its own reply",
			"saga %s: replies name one message for two outcomes; the parent could not tell them apart", s.FullName)
		return nil
	}
	return r
}

// findSaga resolves a saga name (package-relative or full) like a message
// reference: the innermost package first.
func (b *builder) findSaga(pkg protoreflect.FullName, name string) *sagaDecl {
	name = strings.TrimSpace(name)
	candidates := []string{strings.TrimPrefix(name, ".")}
	if !strings.HasPrefix(name, ".") {
		candidates = nil
		for scope := string(pkg); ; {
			if scope == "" {
				candidates = append(candidates, name)
				break
			}
			candidates = append(candidates, scope+"."+name)
			if i := strings.LastIndexByte(scope, '.'); i >= 0 {
				scope = scope[:i]
			} else {
				scope = ""
			}
		}
	}
	for _, c := range candidates {
		for _, d := range b.sagas {
			if d.saga != nil && d.saga.FullName == c {
				return d
			}
		}
	}
	return nil
}

// children resolves and reviews every child step once all sagas are built:
// the child exists and can be a child (rule child-reference), the step's
// messages are the child's (child-replies), its role suits what the child
// does (child-compensation, child-pivot), and no saga is its own ancestor
// (child-cycle). It returns the sagas it found errors in.
func (b *builder) children() map[*sagaDecl]bool {
	bad := map[*sagaDecl]bool{}
	errorf := func(d *sagaDecl, p []int32, rule, hint, format string, args ...any) {
		bad[d] = true
		b.errorf(d.file, p, rule, hint, format, args...)
	}
	for _, d := range b.sagas {
		s := d.saga
		pkg := d.msg.Desc.ParentFile().Package()
		for i, st := range s.Steps {
			name := d.opts.GetSteps()[i].GetChild()
			if name == "" {
				continue
			}
			sp := path(d.base, sagaSteps, int32(i))
			p := path(sp, stepChild)
			cd := b.findSaga(pkg, name)
			switch {
			case cd == nil:
				var sagas []string
				for _, o := range b.sagas {
					if o.saga != nil {
						sagas = append(sagas, o.saga.FullName)
					}
				}
				errorf(d, p, "child-reference", didYouMean(name, nameChoices(name, string(pkg), sagas),
					"name a saga of this package or its full name (\"<package>.<Name>\"); its file must be in the same generation request"),
					"saga %s: step %s: child %q: unknown saga", s.FullName, st.Name, name)
				continue
			case st.External:
				errorf(d, path(sp, stepExternal), "child-reference", "remove external: a child step sends the child's start message",
					"saga %s: step %s starts child %s but is external", s.FullName, st.Name, cd.saga.FullName)
				continue
			case cd.saga.Replies == nil:
				errorf(d, p, "child-reference", fmt.Sprintf("declare replies: {completed: ..., failed: ...} on saga %s, so it can answer its parent", cd.saga.FullName),
					"saga %s: step %s: child %s declares no replies: its outcome would never reach the parent", s.FullName, st.Name, cd.saga.FullName)
				continue
			}
			c := cd.saga
			st.Child = c
			if st.Command != nil && c.Start != nil && st.Command != c.Start {
				errorf(d, path(sp, stepCommand), "child-replies", fmt.Sprintf("send %s, the start message of %s", c.Start.FullName, c.FullName),
					"saga %s: step %s sends %s, but child %s starts from %s", s.FullName, st.Name, st.Command.FullName, c.FullName, c.Start.FullName)
			}
			if c.Start != nil && c.Start.Kind != sagav1.Kind_KIND_COMMAND {
				errorf(d, p, "child-reference", fmt.Sprintf("start %s from a command (no owner), so that exactly one child answers", c.FullName),
					"saga %s: step %s: child %s starts from event %s, which any number of sagas may consume", s.FullName, st.Name, c.FullName, c.Start.FullName)
			}
			want := func(field int32, got []*Message, r *Message, what string) {
				if r == nil {
					return
				}
				if len(got) != 1 || got[0] != r {
					errorf(d, path(sp, field), "child-replies", fmt.Sprintf("set %s: %q, the child's %s reply", what, r.FullName, map[int32]string{stepSuccess: "completed", stepFailure: "failed", stepCompensationReply: "cancelled"}[field]),
						"saga %s: step %s: %s is %s, but child %s answers with %s", s.FullName, st.Name, what, names(got), c.FullName, r.FullName)
				}
			}
			want(stepSuccess, st.Success, c.Replies.Completed, "success")
			want(stepFailure, st.Failure, c.Replies.Failed, "failure")
			b.childRole(d, sp, st, c, errorf)
		}
	}
	b.childCycles(bad)
	return bad
}

func names(ms []*Message) string {
	if len(ms) == 0 {
		return "empty"
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.FullName
	}
	return strings.Join(out, ", ")
}

// childRole checks a child step's role against what the child does. A
// compensatable step compensates the child by cancelling it after it
// completed, which needs a child with nothing past a point of no return
// and a cancel; its compensation is the child's cancel message and its
// compensation reply the child's cancelled reply. A check step leaves
// nothing to undo, so its child may not have compensatable steps. A child
// with a pivot or retriable steps cannot be undone: its step is a pivot
// or later.
func (b *builder) childRole(d *sagaDecl, sp []int32, st *Step, c *Saga, errorf func(*sagaDecl, []int32, string, string, string, ...any)) {
	s := d.saga
	rp := path(sp, stepRole)
	irreversible := ""
	compensatable := ""
	for _, cs := range c.Steps {
		switch cs.Role {
		case sagav1.Role_ROLE_PIVOT, sagav1.Role_ROLE_RETRIABLE:
			if irreversible == "" {
				irreversible = fmt.Sprintf("%s step %s", roleName(cs.Role), cs.Name)
			}
		case sagav1.Role_ROLE_COMPENSATABLE:
			if compensatable == "" {
				compensatable = cs.Name
			}
		}
	}
	switch st.Role {
	case sagav1.Role_ROLE_COMPENSATABLE:
		switch {
		case irreversible != "":
			errorf(d, rp, "child-pivot", "make the step the pivot (or a retriable step after it): what the child did past its point of no return cannot be undone",
				"saga %s: compensatable step %s starts child %s, which has %s: compensating the step could not undo the child", s.FullName, st.Name, c.FullName, irreversible)
		case c.Cancel == nil || c.Cancel.Message == nil || c.Replies.Cancelled == nil:
			errorf(d, rp, "child-compensation", fmt.Sprintf("declare cancel: {...} and replies.cancelled on saga %s, or make the step a check step if the child leaves nothing to undo", c.FullName),
				"saga %s: compensatable step %s starts child %s, which declares no cancel (and cancelled reply): the step has no way to compensate it", s.FullName, st.Name, c.FullName)
		default:
			if st.Compensation != c.Cancel.Message {
				errorf(d, path(sp, stepCompensation), "child-compensation", fmt.Sprintf("set compensation: %q, the child's cancel message", c.Cancel.Message.FullName),
					"saga %s: step %s compensates with %s, but child %s is cancelled by %s", s.FullName, st.Name, nameOf(st.Compensation), c.FullName, c.Cancel.Message.FullName)
			}
			if st.CompensationReply != c.Replies.Cancelled {
				errorf(d, path(sp, stepCompensationReply), "child-compensation", fmt.Sprintf("set compensation_reply: %q, the child's cancelled reply", c.Replies.Cancelled.FullName),
					"saga %s: step %s waits for compensation reply %s, but child %s answers a cancel with %s", s.FullName, st.Name, nameOf(st.CompensationReply), c.FullName, c.Replies.Cancelled.FullName)
			}
			if len(st.CompensationFailure) > 0 {
				errorf(d, path(sp, stepCompensationFailure, 0), "child-compensation", "remove compensation_failure: a child answers a cancel only with its cancelled reply (a failed compensation puts the child in manual review)",
					"saga %s: step %s lists compensation failures, which child %s never sends", s.FullName, st.Name, c.FullName)
			}
		}
	case sagav1.Role_ROLE_CHECK:
		if irreversible != "" || compensatable != "" {
			what := irreversible
			if what == "" {
				what = "compensatable step " + compensatable
			}
			errorf(d, rp, "child-compensation", "make the step compensatable (the child's cancel undoes it), or the pivot when the child cannot be undone",
				"saga %s: check step %s starts child %s, which has %s: a check leaves nothing to undo, so a later failure would leave the child's effects in place", s.FullName, st.Name, c.FullName, what)
		}
	}
}

func nameOf(m *Message) string {
	if m == nil {
		return "nothing"
	}
	return m.FullName
}

// childCycles reports a saga that is its own ancestor: its children (or
// theirs) start it again, without end.
func (b *builder) childCycles(bad map[*sagaDecl]bool) {
	for _, d := range b.sagas {
		var chain []string
		var visit func(s *Saga) bool
		onPath := map[*Saga]bool{}
		visit = func(s *Saga) bool {
			for _, st := range s.Steps {
				if st.Child == nil {
					continue
				}
				chain = append(chain, st.Child.FullName)
				if st.Child == d.saga {
					return true
				}
				if !onPath[st.Child] {
					onPath[st.Child] = true
					if visit(st.Child) {
						return true
					}
				}
				chain = chain[:len(chain)-1]
			}
			return false
		}
		if visit(d.saga) {
			i := slices.IndexFunc(d.saga.Steps, func(st *Step) bool { return st.Child != nil && st.Child.FullName == chain[0] })
			bad[d] = true
			b.errorf(d.file, path(d.base, sagaSteps, int32(max(i, 0)), stepChild), "child-cycle", "break the cycle: a saga cannot start itself, directly or through its children",
				"saga %s is its own ancestor: %s", d.saga.FullName, strings.Join(append([]string{d.saga.FullName}, chain...), " → "))
		}
	}
}

// replyFieldsFilled warns (rule reply-fields) about each field of reply m,
// other than its correlation field, that the saga data has no field of the
// same name and type for: the runtime copies the reply's fields from the
// data by name and type, so that field always goes out empty.
func (b *builder) replyFieldsFilled(f *protogen.File, p []int32, s *Saga, outcome string, m *Message) {
	if s.Data == nil || m.Proto == nil {
		return
	}
	data := s.Data.Desc.Fields()
	fields := m.Proto.Desc.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if m.Correlation != nil && fd.Name() == m.Correlation.Fields[0].Desc.Name() {
			continue // checked above
		}
		df := data.ByName(fd.Name())
		if df != nil && sameFieldType(fd, df) {
			continue
		}
		why := "has no field " + string(fd.Name())
		if df != nil {
			why = fmt.Sprintf("has %s as %s, the reply as %s", fd.Name(), fieldTypeName(df), fieldTypeName(fd))
		}
		b.report(f, p, true, "reply-fields", fmt.Sprintf("give %s a field %s of the reply's type, or remove it from the reply", s.Data.Desc.FullName(), fd.Name()),
			"saga %s: replies %s %s: field %s always goes out empty: the runtime copies the reply's fields from the saga data by name and type, and %s %s",
			s.FullName, outcome, m.FullName, fd.Name(), s.Data.Desc.FullName(), why)
	}
}

// sameFieldType reports whether a and b hold the same kind of value (the
// runtime's test for copying a saga data field into a reply).
func sameFieldType(a, b protoreflect.FieldDescriptor) bool {
	if a.Kind() != b.Kind() || a.Cardinality() != b.Cardinality() || a.IsMap() != b.IsMap() {
		return false
	}
	switch {
	case a.Message() != nil:
		return b.Message() != nil && a.Message().FullName() == b.Message().FullName()
	case a.Enum() != nil:
		return b.Enum() != nil && a.Enum().FullName() == b.Enum().FullName()
	}
	return true
}

// fieldTypeName names fd's type as a contract writes it.
func fieldTypeName(fd protoreflect.FieldDescriptor) string {
	t := fd.Kind().String()
	switch {
	case fd.IsMap():
		return "a map"
	case fd.Message() != nil:
		t = string(fd.Message().FullName())
	case fd.Enum() != nil:
		t = string(fd.Enum().FullName())
	}
	if fd.Cardinality() == protoreflect.Repeated {
		return "repeated " + t
	}
	return t
}
