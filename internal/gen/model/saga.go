package model

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
	"github.com/protosaga/saga/runtime/sagadef"
)

func (b *builder) resolveSagas() {
	failed := map[*sagaDecl]bool{}
	for _, d := range b.sagas {
		before := len(b.diags)
		d.saga = b.saga(d)
		failed[d] = b.errorsSince(before)
	}
	// Child steps name other sagas: reviewed once every saga is built.
	for d := range b.children() {
		failed[d] = true
	}
	for _, d := range b.sagas {
		if failed[d] || !d.file.Generate {
			continue
		}
		// The runtime's own compiler is the last reviewer: the table it
		// computes is the one generated code and docs print.
		def := d.saga.definition()
		if err := sagadef.Compile(def); err != nil {
			b.errorf(d.file, d.base, "saga-definition", "fix the saga declaration; the runtime cannot compile it",
				"saga %s: %v", d.saga.FullName, err)
			continue
		}
		d.saga.Definition = def
	}
}

// errorsSince reports whether a diagnostic from index i on is an error (a
// warning does not stop the saga from being compiled and rendered).
func (b *builder) errorsSince(i int) bool {
	for _, d := range b.diags[i:] {
		if !d.Warning {
			return true
		}
	}
	return false
}

func (b *builder) saga(d *sagaDecl) *Saga {
	f, o, base := d.file, d.opts, d.base
	pkg := d.msg.Desc.ParentFile().Package()
	s := &Saga{Data: d.msg, File: f, Name: o.GetName(), Generate: f.Generate}
	switch {
	case s.Name == "":
		// The name derived from the data message names the same generated
		// identifiers as an explicit one, so it is held to the same rule.
		data := string(d.msg.Desc.Name())
		s.Name = strings.TrimSuffix(data, "Data")
		if s.Name == "" {
			s.Name = data
		}
		if !camelRE.MatchString(s.Name) {
			b.errorf(f, base, "saga-name", "set name: \"PlaceOrder\" (a CamelCase name) in the saga option, or rename the data message",
				"saga name %q, derived from data message %s, is not a CamelCase identifier", s.Name, data)
		}
	case !camelRE.MatchString(s.Name):
		b.errorf(f, path(base, sagaName), "saga-name", "use a CamelCase name such as \"PlaceOrder\"",
			"invalid saga name %q", s.Name)
	}
	s.FullName = s.Name
	if pkg != "" {
		s.FullName = string(pkg) + "." + s.Name
	}
	s.Snake = Snake(s.Name)
	s.Table = "saga_" + s.Snake
	b.checkTable(f, path(base, sagaName), s)
	s.Service = o.GetService()
	if s.Service == "" {
		s.Service = s.Snake
	} else if !serviceRE.MatchString(s.Service) {
		b.errorf(f, path(base, sagaService), "routing-key", "service names are lower-case words separated by '-', '_' or '.'",
			"saga %s: invalid service name %q", s.FullName, s.Service)
	}
	s.Queue = s.Service + ".saga." + s.Snake
	queueAt := path(base, sagaName)
	if o.GetService() != "" {
		queueAt = path(base, sagaService)
	}
	b.checkQueue(f, queueAt, "saga "+s.FullName, s.Queue, "shorten the saga's service or name; its queue is \"<service>.saga.<snake_case name>\"")
	if o.GetStart() == "" {
		b.errorf(f, base, "saga-start", "add start: \"<message that starts the saga>\"",
			"saga %s declares no start message", s.FullName)
	} else if st := b.ref(f, path(base, sagaStart), pkg, "saga "+s.FullName+": ", o.GetStart(), sagav1.Kind_KIND_UNSPECIFIED, "start"); st != nil {
		switch {
		case st.Kind == sagav1.Kind_KIND_REPLY:
			b.errorf(f, path(base, sagaStart), "saga-start", "start a saga from a command or an event",
				"saga %s: start message %s is a reply", s.FullName, st.FullName)
		case st.Kind == sagav1.Kind_KIND_COMMAND && st.Owner != "":
			b.startOwner(f, path(base, sagaStart), s, st)
			s.Start = st
		default:
			s.Start = st
		}
	}
	switch {
	case o.GetBusinessKey() == "":
		b.errorf(f, base, "saga-business-key", "add business_key: \"<field of the start message>\"; starting twice with one key returns the same saga",
			"saga %s declares no business key", s.FullName)
	case s.Start != nil:
		s.BusinessKey = b.fieldPath(f, path(base, sagaBusinessKey), s.Start.Proto, o.GetBusinessKey(), true)
	}
	if o.GetDeadline() != "" {
		s.Deadline = b.duration(f, path(base, sagaDeadline), "saga "+s.FullName+": ", o.GetDeadline(), "deadline")
	}
	if len(o.GetSteps()) == 0 {
		b.errorf(f, base, "saga-steps", "declare at least one step", "saga %s has no steps", s.FullName)
	}
	for i, so := range o.GetSteps() {
		s.Steps = append(s.Steps, b.step(f, path(base, sagaSteps, int32(i)), pkg, s, so))
	}
	b.stepOrder(f, base, s)
	b.groups(f, base, s, o)
	b.deadlinePath(f, base, s)
	b.conversation(f, base, s, o)
	if o.GetCancel() != nil {
		s.Cancel = b.cancel(f, path(base, sagaCancel), pkg, s, o.GetCancel())
	}
	if o.GetCallback() != nil {
		s.Callback = b.callback(f, path(base, sagaCallback), s, o.GetCallback())
	}
	if o.GetReplies() != nil {
		s.Replies = b.replies(f, path(base, sagaReplies), pkg, s, o.GetReplies())
	}
	return s
}

// outcomeStates maps each callback outcome to the state it reports.
var outcomeStates = map[sagav1.Outcome]string{
	sagav1.Outcome_OUTCOME_COMPLETED:     sagadef.StateCompleted,
	sagav1.Outcome_OUTCOME_FAILED:        sagadef.StateFailed,
	sagav1.Outcome_OUTCOME_CANCELLED:     sagadef.StateCancelled,
	sagav1.Outcome_OUTCOME_MANUAL_REVIEW: sagadef.StateManualReview,
}

// callback reviews a saga's callback declaration: at least one outcome,
// each once and meaningful for the saga (CANCELLED needs a cancel), and
// exactly one target field, a singular string of the saga data message.
func (b *builder) callback(f *protogen.File, base []int32, s *Saga, o *sagav1.Callback) *Callback {
	c := &Callback{IncludeData: o.GetIncludeData()}
	if len(o.GetOutcomes()) == 0 {
		b.errorf(f, base, "callback-outcomes", "add outcomes: [OUTCOME_COMPLETED, OUTCOME_FAILED] (the outcomes the client is told about)",
			"saga %s: callback names no outcome", s.FullName)
	}
	seen := map[sagav1.Outcome]bool{}
	for i, out := range o.GetOutcomes() {
		p := path(base, callbackOutcomes, int32(i))
		state, ok := outcomeStates[out]
		switch {
		case !ok:
			b.errorf(f, p, "callback-outcomes", "use OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_CANCELLED or OUTCOME_MANUAL_REVIEW",
				"saga %s: callback outcome %s is not an outcome", s.FullName, out)
		case seen[out]:
			b.errorf(f, p, "callback-outcomes", "list each outcome once",
				"saga %s: callback outcome %s is listed twice", s.FullName, out)
		case out == sagav1.Outcome_OUTCOME_CANCELLED && s.Cancel == nil:
			b.errorf(f, p, "callback-outcomes", "declare cancel: {...} on the saga, or drop OUTCOME_CANCELLED",
				"saga %s: callback outcome OUTCOME_CANCELLED can never happen: the saga declares no cancel", s.FullName)
		default:
			c.States = append(c.States, state)
		}
		seen[out] = true
	}
	url, client := o.GetUrlField(), o.GetClientField()
	if (url == "") == (client == "") {
		b.errorf(f, base, "callback-target", "set url_field (the URL a request registered, kept in the saga data) or client_field (a client whose endpoint the dispatcher knows), not both",
			"saga %s: callback sets %s", s.FullName, map[bool]string{true: "neither url_field nor client_field", false: "both url_field and client_field"}[url == ""])
		return c
	}
	field, value, set := int32(callbackURLField), url, func(p *FieldPath) { c.URLField = p }
	name := "url_field"
	if client != "" {
		field, value, set, name = callbackClientField, client, func(p *FieldPath) { c.ClientField = p }, "client_field"
	}
	p := path(base, field)
	if s.Data == nil {
		return c
	}
	fpath := b.fieldPath(f, p, s.Data, value, false)
	if fpath == nil {
		return c
	}
	if leaf := fpath.Leaf(); leaf.Desc.Kind() != protoreflect.StringKind || leaf.Desc.IsList() || leaf.Desc.IsMap() {
		b.errorf(f, p, "callback-target", "name a singular string field of the saga data",
			"saga %s: callback %s %q names a field of type %s in %s, not a string", s.FullName, name, value, fieldKind(leaf), s.Data.Desc.FullName())
		return c
	}
	set(fpath)
	return c
}

// cancel resolves and reviews a saga's business cancellation: an annotated
// command (without owner: the saga's queue consumes it) or event, which
// finds its saga by a correlation field, plays no other part in the saga,
// and names the string fields saying who asked and why.
func (b *builder) cancel(f *protogen.File, base []int32, pkg protoreflect.FullName, s *Saga, o *sagav1.Cancel) *Cancel {
	c := &Cancel{}
	if o.GetMessage() == "" {
		b.errorf(f, base, "cancel-reference", "add message: \"<command or event that cancels the saga>\"",
			"saga %s: cancel names no message", s.FullName)
	} else if m := b.refAs("cancel-reference", f, path(base, cancelMessage), pkg, "saga "+s.FullName+": ", o.GetMessage(), sagav1.Kind_KIND_UNSPECIFIED, "cancel message"); m != nil {
		p := path(base, cancelMessage)
		switch {
		case m.Kind == sagav1.Kind_KIND_REPLY:
			b.errorf(f, p, "cancel-reference", "cancel with a command the saga's queue consumes, or an event",
				"saga %s: cancel message %s is a reply; a reply answers a command the saga sent", s.FullName, m.FullName)
		case m.Correlation == nil:
			b.errorf(f, p, "cancel-correlation", "add correlation_field: \"<business key or saga id field>\" to "+m.FullName,
				"saga %s: cancel message %s declares no correlation field, so the engine cannot find the saga it cancels", s.FullName, m.FullName)
			c.Message = m
		default:
			c.Message = m
		}
		if part := s.part(m); part != "" {
			b.errorf(f, p, "cancel-ambiguous", "cancel with a message of its own; every message plays one part in a saga",
				"saga %s: cancel message %s is already the %s; the saga could not tell a cancel from it", s.FullName, m.FullName, part)
			c.Message = nil
		}
	}
	for _, fp := range []struct {
		field int32
		name  string
		value string
		set   func(*FieldPath)
	}{
		{cancelRequestedBy, "requested_by", o.GetRequestedBy(), func(p *FieldPath) { c.RequestedBy = p }},
		{cancelReason, "reason", o.GetReason(), func(p *FieldPath) { c.Reason = p }},
	} {
		p := path(base, fp.field)
		switch {
		case fp.value == "":
			b.errorf(f, base, "cancel-fields", "add "+fp.name+": \"<string field of the cancel message>\"; the audit trail records who asked and why",
				"saga %s: cancel names no %s field", s.FullName, fp.name)
		case c.Message == nil:
		default:
			fpath := b.fieldPath(f, p, c.Message.Proto, fp.value, false)
			if fpath == nil {
				continue
			}
			if leaf := fpath.Leaf(); leaf.Desc.Kind() != protoreflect.StringKind || leaf.Desc.IsList() || leaf.Desc.IsMap() {
				b.errorf(f, p, "cancel-fields", "name a singular string field",
					"saga %s: cancel %s %q names a field of type %s in %s, not a string", s.FullName, fp.name, fp.value, fieldKind(leaf), c.Message.FullName)
				continue
			}
			fp.set(fpath)
		}
	}
	return c
}

// part returns the part m plays in s ("start message", "success reply of
// step X", ...), or "" when it plays none.
func (s *Saga) part(m *Message) string {
	if m == s.Start {
		return "start message"
	}
	for _, st := range s.Steps {
		reply := "reply"
		if st.External {
			reply = "event"
		}
		for _, u := range []struct {
			what string
			ms   []*Message
		}{
			{"command", []*Message{st.Command}}, {"success " + reply, st.Success}, {"failure " + reply, st.Failure},
			{"compensation", []*Message{st.Compensation}}, {"compensation reply", []*Message{st.CompensationReply}},
			{"compensation failure", st.CompensationFailure},
		} {
			if slices.Contains(u.ms, m) {
				return u.what + " of step " + st.Name
			}
		}
	}
	return ""
}

func (b *builder) step(f *protogen.File, base []int32, pkg protoreflect.FullName, s *Saga, o *sagav1.Step) *Step {
	st := &Step{
		Name: o.GetName(), Role: o.GetRole(), External: o.GetExternal(), Conditional: o.GetConditional(),
		OnTimeout: o.GetOnTimeout(), MaxAttempts: int(o.GetMaxAttempts()), Late: o.GetLateReply(),
	}
	// Findings inside a step are located at the step (buf records nothing
	// finer), so their messages name the step: by its name, or by its
	// number while the name is not known yet.
	ctx := fmt.Sprintf("saga %s: step #%d: ", s.FullName, len(s.Steps)+1)
	if st.Name != "" {
		ctx = fmt.Sprintf("saga %s: step %s: ", s.FullName, st.Name)
	}
	replyKind := sagav1.Kind_KIND_REPLY
	if st.External {
		replyKind = sagav1.Kind_KIND_EVENT
		if o.GetCommand() != "" {
			b.errorf(f, path(base, stepCommand), "step-external", "an external step waits for an event; remove command or external",
				"%sexternal step sends command %q", ctx, o.GetCommand())
		}
	} else if o.GetCommand() == "" {
		b.errorf(f, base, "step-external", "add command: \"<command the step sends>\", or external: true for a step that waits for an event",
			"saga %s: step %d sends no command", s.FullName, len(s.Steps)+1)
	} else {
		st.Command = b.ref(f, path(base, stepCommand), pkg, ctx, o.GetCommand(), sagav1.Kind_KIND_COMMAND, "command")
	}
	refs := func(field int32, names []string, kind sagav1.Kind, what string) []*Message {
		var out []*Message
		for i, n := range names {
			if m := b.ref(f, path(base, field, int32(i)), pkg, ctx, n, kind, what); m != nil {
				out = append(out, m)
			}
		}
		return out
	}
	st.Success = refs(stepSuccess, o.GetSuccess(), replyKind, "success")
	st.Failure = refs(stepFailure, o.GetFailure(), replyKind, "failure")
	if st.Name == "" {
		switch {
		case st.Command != nil:
			st.Name = string(st.Command.Proto.Desc.Name())
		case len(st.Success) > 0:
			st.Name = string(st.Success[0].Proto.Desc.Name())
		}
	} else if !camelRE.MatchString(st.Name) {
		b.errorf(f, path(base, stepName), "step-name", "use a CamelCase name such as \"ReserveInventory\"",
			"saga %s: invalid step name %q", s.FullName, st.Name)
	}
	label := st.Name
	if label == "" {
		label = fmt.Sprintf("#%d", len(s.Steps)+1)
	}
	ctx = fmt.Sprintf("saga %s: step %s: ", s.FullName, label)
	if o.GetChild() == "" {
		// A child step's command is the child's start message, which the
		// child's queue consumes (rules child-*).
		b.ownedCommand(f, path(base, stepCommand), s, st.Command, label, "sends")
	}
	for _, prev := range s.Steps {
		if prev.Name == st.Name && st.Name != "" {
			b.errorf(f, base, "step-name", "give each step a unique name (name: \"...\")",
				"saga %s: duplicate step name %q", s.FullName, st.Name)
		}
	}
	if len(o.GetSuccess()) == 0 {
		b.errorf(f, base, "step-replies", "list the replies (events, for external steps) that complete the step in success",
			"saga %s: step %s has no success reply", s.FullName, label)
	}
	if st.Role == sagav1.Role_ROLE_UNSPECIFIED {
		b.errorf(f, base, "step-role", "set role: ROLE_COMPENSATABLE, ROLE_CHECK, ROLE_PIVOT or ROLE_RETRIABLE",
			"saga %s: step %s declares no role", s.FullName, label)
	}
	hasComp := o.GetCompensation() != "" || o.GetCompensationReply() != "" || len(o.GetCompensationFailure()) > 0
	switch {
	case st.Role == sagav1.Role_ROLE_COMPENSATABLE:
		if o.GetCompensation() == "" || o.GetCompensationReply() == "" {
			b.errorf(f, base, "step-compensation", "add compensation and compensation_reply, make the step the pivot, or make it ROLE_CHECK when it leaves nothing to undo",
				"saga %s: compensatable step %s has no compensation", s.FullName, label)
		}
	case hasComp && st.Role != sagav1.Role_ROLE_UNSPECIFIED:
		b.errorf(f, path(base, stepCompensation), "step-compensation", "only compensatable steps are compensated; make the step compensatable or remove the compensation",
			"saga %s: %s step %s declares a compensation", s.FullName, roleName(st.Role), label)
	}
	if o.GetCompensation() != "" {
		st.Compensation = b.ref(f, path(base, stepCompensation), pkg, ctx, o.GetCompensation(), sagav1.Kind_KIND_COMMAND, "compensation")
		if o.GetChild() == "" {
			b.ownedCommand(f, path(base, stepCompensation), s, st.Compensation, label, "compensates with")
		}
		b.compensationOwner(f, path(base, stepCompensation), s, st, label)
	}
	if o.GetCompensationReply() != "" {
		st.CompensationReply = b.ref(f, path(base, stepCompensationReply), pkg, ctx, o.GetCompensationReply(), sagav1.Kind_KIND_REPLY, "compensation_reply")
	}
	st.CompensationFailure = refs(stepCompensationFailure, o.GetCompensationFailure(), sagav1.Kind_KIND_REPLY, "compensation_failure")

	if o.GetTimeout() == "" {
		b.errorf(f, base, "step-timeout", "add timeout: \"30s\" (Go duration); every wait needs an end",
			"saga %s: step %s has no timeout", s.FullName, label)
	} else {
		st.Timeout = b.duration(f, path(base, stepTimeout), ctx, o.GetTimeout(), "timeout")
	}
	if st.Late == sagav1.LateReply_LATE_REPLY_UNSPECIFIED {
		b.errorf(f, base, "step-late-reply", "add late_reply: LATE_REPLY_IGNORE, LATE_REPLY_MANUAL_REVIEW or LATE_REPLY_APPLY_IF_WAITING",
			"saga %s: step %s has no late-reply policy", s.FullName, label)
	}
	if st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_UNSPECIFIED {
		st.OnTimeout = sagav1.TimeoutAction_TIMEOUT_ACTION_COMPENSATE
		if st.Role == sagav1.Role_ROLE_RETRIABLE {
			st.OnTimeout = sagav1.TimeoutAction_TIMEOUT_ACTION_RETRY
		}
	} else if st.Role == sagav1.Role_ROLE_RETRIABLE && st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_COMPENSATE {
		b.errorf(f, path(base, stepOnTimeout), "step-timeout", "a retriable step runs after the pivot and cannot compensate; use TIMEOUT_ACTION_RETRY or TIMEOUT_ACTION_MANUAL_REVIEW",
			"saga %s: retriable step %s compensates on timeout", s.FullName, label)
	}
	if st.Role == sagav1.Role_ROLE_PIVOT && st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_COMPENSATE &&
		st.Late != sagav1.LateReply_LATE_REPLY_UNSPECIFIED && st.Late != sagav1.LateReply_LATE_REPLY_MANUAL_REVIEW {
		p := base
		if o.GetLateReply() != sagav1.LateReply_LATE_REPLY_UNSPECIFIED {
			p = path(base, stepLateReply)
		}
		hint := "set late_reply: LATE_REPLY_MANUAL_REVIEW, or on_timeout: TIMEOUT_ACTION_RETRY or TIMEOUT_ACTION_MANUAL_REVIEW"
		if st.External {
			// An external step sends nothing to retry (retry-budget).
			hint = "set late_reply: LATE_REPLY_MANUAL_REVIEW, or on_timeout: TIMEOUT_ACTION_MANUAL_REVIEW"
		}
		b.report(f, p, true, "pivot-late-reply", hint,
			"saga %s: pivot step %s compensates on timeout but does not send late replies to manual review: a success arriving after the timeout (the point of no return passed) is only audited while the saga compensates and fails",
			s.FullName, label)
	}
	if (sagadef.Step{External: st.External, OnTimeout: sagadef.TimeoutAction(st.OnTimeout), Late: sagadef.LatePolicy(st.Late)}).LatePolicyInert() {
		why := fmt.Sprintf("on_timeout is %s, not TIMEOUT_ACTION_RETRY", st.OnTimeout)
		if o.GetOnTimeout() == sagav1.TimeoutAction_TIMEOUT_ACTION_UNSPECIFIED {
			why = fmt.Sprintf("on_timeout is %s (the default for a %s step), not TIMEOUT_ACTION_RETRY", st.OnTimeout, roleName(st.Role))
		}
		hint := "use LATE_REPLY_MANUAL_REVIEW (a human looks at late replies) or LATE_REPLY_IGNORE, or on_timeout: TIMEOUT_ACTION_RETRY to resend the command"
		if st.External {
			why = "an external step sends no command"
			hint = "use LATE_REPLY_MANUAL_REVIEW (a human looks at late events) or LATE_REPLY_IGNORE"
		}
		b.errorf(f, path(base, stepLateReply), "late-reply-inert", hint,
			"saga %s: step %s: LATE_REPLY_APPLY_IF_WAITING applies only the answer to an earlier attempt while the step waits for a later one, and the step makes no earlier attempts: %s; the policy acts as LATE_REPLY_IGNORE",
			s.FullName, label, why)
	}
	if st.MaxAttempts < 0 {
		b.errorf(f, path(base, stepMaxAttempts), "retry-budget", "use a positive max_attempts",
			"saga %s: step %s: max_attempts %d is negative", s.FullName, label, st.MaxAttempts)
	}
	if st.MaxAttempts == 0 {
		st.MaxAttempts = 1
	}
	if st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_RETRY {
		switch {
		case st.External:
			b.errorf(f, path(base, stepOnTimeout), "retry-budget", "an external step sends nothing to retry; use TIMEOUT_ACTION_COMPENSATE or TIMEOUT_ACTION_MANUAL_REVIEW",
				"saga %s: external step %s retries on timeout", s.FullName, label)
		case st.MaxAttempts < 2:
			b.errorf(f, path(base, stepMaxAttempts), "retry-budget", "set max_attempts to 2 or more, or choose another on_timeout",
				"saga %s: step %s retries on timeout but its budget is %d attempt(s), so it never retries", s.FullName, label, st.MaxAttempts)
		}
	}
	// timeout × max_attempts > deadline, compared without multiplying: the
	// product can overflow time.Duration (2 × "2000000h" wraps negative).
	if n := time.Duration(st.MaxAttempts); s.Deadline > 0 && st.Timeout > 0 && n > 0 && st.Timeout > s.Deadline/n {
		worst := "more than " + time.Duration(math.MaxInt64).Truncate(time.Hour).String()
		if st.Timeout <= math.MaxInt64/n {
			worst = (st.Timeout * n).String()
		}
		b.errorf(f, path(base, stepTimeout), "retry-budget", "lower max_attempts or timeout, or raise the saga deadline",
			"saga %s: step %s can wait %s (max_attempts %d × timeout %s), longer than the saga deadline %s",
			s.FullName, label, worst, st.MaxAttempts, st.Timeout, s.Deadline)
	}
	b.retryTiers(f, path(base, stepTimeout), s, st, label)
	return st
}

// retryTiers reports a pivot whose timeout compensates before its
// participant's consumer has stopped redelivering its command through the
// retry tiers. The command can then run after the saga compensated the
// steps before the pivot, and a pivot has no compensation of its own that
// would record it as done (message.HeaderCompensates), so its effect, the
// point of no return, stays. A compensatable step's command is recorded as
// done by its compensation when both have one owner (compensation-owner);
// a timeout that retries or sends to manual review sends no compensation.
func (b *builder) retryTiers(f *protogen.File, p []int32, s *Saga, st *Step, label string) {
	if st.Role != sagav1.Role_ROLE_PIVOT || st.External || st.OnTimeout != sagav1.TimeoutAction_TIMEOUT_ACTION_COMPENSATE || st.Timeout <= 0 {
		return
	}
	pol := QueueRetry(st.Command)
	delay := RetryDelay(pol)
	if st.Timeout > delay {
		return
	}
	source := "the retry tiers of retry.Default(), which the generated Topology declares for a queue whose commands declare no retry"
	if st.Command != nil && st.Command.Retry != nil {
		source = "the retry declared on " + st.Command.FullName
	}
	b.report(f, p, true, "retry-tiers",
		fmt.Sprintf("raise the timeout above %s, declare shorter retry tiers on the command, or set on_timeout: TIMEOUT_ACTION_RETRY or TIMEOUT_ACTION_MANUAL_REVIEW (the review assumes %s)", delay, source),
		"saga %s: pivot step %s compensates on timeout after %s, but its participant's consumer redelivers a command that failed for up to %s (retry tiers %s): the pivot's command can run after the saga compensated the steps before it, and nothing undoes the point of no return",
		s.FullName, label, st.Timeout, delay, tierList(pol))
}

// compensationOwner reports a compensatable step whose command and
// compensation have different owners. A compensation can overtake the
// command it undoes (a command still waiting in a retry tier, or slow to
// run, when its step timed out or was cancelled); the runtime keeps the
// command from running afterwards by recording it as done under the
// compensating service (message.HeaderCompensates), a record the
// command's own service never sees when it is another service.
func (b *builder) compensationOwner(f *protogen.File, p []int32, s *Saga, st *Step, label string) {
	cmd, comp := st.Command, st.Compensation
	if cmd == nil || comp == nil || cmd.Owner == "" || comp.Owner == "" || cmd.Owner == comp.Owner {
		return
	}
	b.report(f, p, true, "compensation-owner",
		fmt.Sprintf("give %s and %s the same owner: the service that applies an effect is the one that undoes it", cmd.FullName, comp.FullName),
		"saga %s: step %s sends %s (owner %s) and compensates with %s (owner %s): a compensation sent while the command still waits in a retry tier records it as done for %s only, so %s runs the command after its compensation and the effect stays",
		s.FullName, label, cmd.FullName, cmd.Owner, comp.FullName, comp.Owner, comp.Owner, cmd.Owner)
}

// startOwner reports a start command that names an owner. A saga's own
// queue consumes its start message (the generated Start, StartTx and HTTP
// handler publish it there), so an owner's participant would only get a
// method for it whose result nothing waits for, while nothing starts the
// saga from that participant.
func (b *builder) startOwner(f *protogen.File, p []int32, s *Saga, st *Message) {
	hint := fmt.Sprintf("remove owner from %s: the saga's own queue consumes its start command", st.FullName)
	if st.Owner != s.Service {
		hint += fmt.Sprintf("; to run the saga in service %s, set service: %q on the saga", st.Owner, st.Owner)
	}
	if st.File.Generate {
		f, p = st.File, path(st.Proto.Location.Path, fieldMessageOptions, extMessage, msgOwner)
	}
	b.errorf(f, p, "saga-start", hint,
		"saga %s starts from command %s, which names owner %s: a start command is consumed by the saga's own queue, but an owned command is routed to the participant of service %s, whose method for it has no reply to return and starts no saga",
		s.FullName, st.FullName, st.Owner, st.Owner)
}

// deadlinePath reports a saga deadline shorter than its longest forward
// path: every step waiting out its whole budget (timeout × max_attempts for
// a step that retries on timeout, one timeout otherwise) one after the
// other. The deadline bounds the forward path only (compensation clears
// it), so a saga whose steps each answer within their own budget would
// still be sent to manual review. A single step over the deadline is a
// retry-budget finding instead. The members of a parallel group wait at
// the same time: a group counts as its longest member.
func (b *builder) deadlinePath(f *protogen.File, base []int32, s *Saga) {
	if s.Deadline <= 0 || len(s.Steps) == 0 {
		return
	}
	var total time.Duration
	var parts []string
	// group is the parallel group the steps just counted belong to, its
	// longest member's wait so far and the index of that member's part.
	var group *Group
	var groupWait time.Duration
	groupPart := -1
	for _, st := range s.Steps {
		if st.Timeout <= 0 {
			return // step-timeout or duration reports it
		}
		wait, n := st.Timeout, 1
		if st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_RETRY && !st.External && st.MaxAttempts > 1 {
			n = st.MaxAttempts
			wait = saturatingMul(st.Timeout, n)
		}
		if wait > s.Deadline {
			return // retry-budget reports the step
		}
		part := st.Name + " " + st.Timeout.String()
		if n > 1 {
			part = fmt.Sprintf("%s %d × %s", st.Name, n, st.Timeout)
		}
		if st.Group != nil && st.Group == group {
			// Another member: only the longest counts.
			if wait > groupWait {
				total = saturatingAdd(total-groupWait, wait)
				groupWait = wait
				parts[groupPart] = fmt.Sprintf("group %s: %s", group.Name, part)
			}
			continue
		}
		group, groupWait, groupPart = st.Group, 0, -1
		if st.Group != nil {
			groupWait, groupPart = wait, len(parts)
			part = fmt.Sprintf("group %s: %s", st.Group.Name, part)
		}
		total = saturatingAdd(total, wait)
		parts = append(parts, part)
	}
	if total <= s.Deadline {
		return
	}
	b.errorf(f, path(base, sagaDeadline), "saga-deadline",
		fmt.Sprintf("raise the deadline to at least %s, or lower the steps' timeouts or max_attempts", durationString(total)),
		"saga %s: deadline %s is shorter than its longest forward path, %s (%s): an instance whose every step answers within its own timeout and attempts can still be sent to manual review by the deadline",
		s.FullName, s.Deadline, durationString(total), strings.Join(parts, " + "))
}

func saturatingMul(d time.Duration, n int) time.Duration {
	if n > 0 && d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

func saturatingAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// durationString prints d, or "more than 2562047h0m0s" for a saturated sum.
func durationString(d time.Duration) string {
	if d == math.MaxInt64 {
		return "more than " + time.Duration(math.MaxInt64).Truncate(time.Hour).String()
	}
	return d.String()
}

// ownedCommand reports a command a step sends that no participant owns:
// nothing binds it to a queue (a saga consumes only its own start message),
// so the relay's mandatory publish is returned and retried forever, and no
// reply ever comes.
func (b *builder) ownedCommand(f *protogen.File, p []int32, s *Saga, cmd *Message, step, verb string) {
	if cmd == nil || cmd.Owner != "" {
		return
	}
	b.errorf(f, p, "command-consumer", fmt.Sprintf("set owner: \"<service that handles it>\" on %s; a step's command is executed and answered by its owner", cmd.FullName),
		"saga %s: step %s %s command %s, which has no owner, so no participant executes it or replies", s.FullName, step, verb, cmd.FullName)
}

func roleName(r sagav1.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// stepOrder checks the structure (compensatable|check)* pivot? retriable*,
// and what skipping a conditional step cannot do.
func (b *builder) stepOrder(f *protogen.File, base []int32, s *Saga) {
	pivot, retriable := "", ""
	if len(s.Steps) > 0 && !slices.ContainsFunc(s.Steps, func(st *Step) bool { return !st.Conditional }) {
		b.errorf(f, path(base, sagaSteps), "step-conditional", "make at least one step unconditional",
			"saga %s: every step is conditional, so the decider could skip them all and the saga would complete without doing anything", s.FullName)
	}
	for i, st := range s.Steps {
		if st.Conditional && st.Role == sagav1.Role_ROLE_PIVOT {
			b.errorf(f, path(base, sagaSteps, int32(i), stepConditional), "step-conditional",
				"remove conditional: the pivot always runs; to make the whole operation optional, make it a separate saga",
				"saga %s: pivot %s is conditional: skipping the point of no return would complete the saga with its retriable steps run on an operation that never became final", s.FullName, st.Name)
		}
		p := path(base, sagaSteps, int32(i), stepRole)
		switch st.Role {
		case sagav1.Role_ROLE_COMPENSATABLE:
			switch {
			case pivot != "":
				b.errorf(f, p, "compensatable-after-pivot", "move the step before the pivot; nothing after the point of no return is undone",
					"saga %s: compensatable step %s follows the pivot %s", s.FullName, st.Name, pivot)
			case retriable != "":
				b.errorf(f, p, "compensatable-after-pivot", "move the step before retriable steps; they cannot be undone if it fails",
					"saga %s: compensatable step %s follows retriable step %s", s.FullName, st.Name, retriable)
			}
		case sagav1.Role_ROLE_PIVOT:
			switch {
			case pivot != "":
				b.errorf(f, p, "non-retriable-after-pivot", "a saga has at most one pivot; make the later steps retriable",
					"saga %s: step %s is a second pivot after %s", s.FullName, st.Name, pivot)
			case retriable != "":
				b.errorf(f, p, "non-retriable-after-pivot", "move the pivot before the retriable steps",
					"saga %s: pivot %s follows retriable step %s", s.FullName, st.Name, retriable)
			default:
				pivot = st.Name
			}
		case sagav1.Role_ROLE_CHECK:
			switch {
			case pivot != "":
				b.errorf(f, p, "check-after-pivot", "move the check before the pivot, or make it retriable: after the point of no return a failure can no longer stop the saga",
					"saga %s: check step %s follows the pivot %s", s.FullName, st.Name, pivot)
			case retriable != "":
				b.errorf(f, p, "check-after-pivot", "move the check before the retriable steps, or make it retriable",
					"saga %s: check step %s follows retriable step %s", s.FullName, st.Name, retriable)
			}
		case sagav1.Role_ROLE_RETRIABLE:
			if retriable == "" {
				retriable = st.Name
			}
		}
		if pivot != "" && pivot != st.Name && st.Role != sagav1.Role_ROLE_RETRIABLE && st.Role != sagav1.Role_ROLE_COMPENSATABLE &&
			st.Role != sagav1.Role_ROLE_CHECK && st.Role != sagav1.Role_ROLE_PIVOT {
			b.errorf(f, p, "non-retriable-after-pivot", "steps after the pivot must be retriable",
				"saga %s: step %s after the pivot %s is not retriable", s.FullName, st.Name, pivot)
		}
	}
}

// conversation checks that every message plays one part in the saga and that
// replies answer the command of their step.
func (b *builder) conversation(f *protogen.File, base []int32, s *Saga, o *sagav1.Saga) {
	seen := map[*Message]string{}
	use := func(m *Message, p []int32, part string) {
		if m == nil {
			return
		}
		if prev, ok := seen[m]; ok {
			b.errorf(f, p, "saga-ambiguous", "use a distinct message type for each command and reply of a saga",
				"saga %s: %s is used as %s and as %s; the saga could not tell which step it belongs to", s.FullName, m.FullName, prev, part)
			return
		}
		seen[m] = part
	}
	if s.Start != nil {
		seen[s.Start] = "start message"
	}
	for i, st := range s.Steps {
		sp := path(base, sagaSteps, int32(i))
		use(st.Command, path(sp, stepCommand), "command of step "+st.Name)
		answers := func(field int32, list []*Message, cmd *Message, what string) {
			for j, r := range list {
				use(r, path(sp, field, int32(j)), what+" of step "+st.Name)
				if r.Answers != nil && cmd != nil && r.Answers != cmd {
					b.errorf(f, path(sp, field, int32(j)), "reply-answers", "list the reply under the step whose command it answers, or fix its answers option",
						"saga %s: step %s waits for %s, which answers %s, not %s", s.FullName, st.Name, r.FullName, r.Answers.FullName, cmd.FullName)
				}
			}
		}
		answers(stepSuccess, st.Success, st.Command, "success reply")
		answers(stepFailure, st.Failure, st.Command, "failure reply")
		use(st.Compensation, path(sp, stepCompensation), "compensation of step "+st.Name)
		if st.CompensationReply != nil {
			answers(stepCompensationReply, []*Message{st.CompensationReply}, st.Compensation, "compensation reply")
		}
		answers(stepCompensationFailure, st.CompensationFailure, st.Compensation, "compensation failure")
	}
}

// crossChecks runs the rules that need every saga and message: consumers,
// waited-for replies, duplicate routing keys.
func (b *builder) crossChecks() {
	consumers := map[*Message][]string{}
	// waited holds, for each reply, the first saga step waiting for it.
	type waiter struct {
		d    *sagaDecl
		step string
		p    []int32
	}
	waited := map[*Message]*waiter{}
	// sent holds the commands that reviewed saga steps send; one without an
	// owner is reported at the step (ownedCommand). used holds every
	// message any saga of the request sends or consumes.
	sent := map[*Message]bool{}
	used := map[*Message]bool{}
	for _, d := range b.sagas {
		s := d.saga
		if s.Start != nil {
			consumers[s.Start] = append(consumers[s.Start], "saga "+s.FullName+" (start, service "+s.Service+")")
			used[s.Start] = true
		}
		if c := s.Cancel; c != nil && c.Message != nil {
			if c.Message.Kind == sagav1.Kind_KIND_COMMAND {
				consumers[c.Message] = append(consumers[c.Message], "saga "+s.FullName+" (cancel, service "+s.Service+")")
			}
			used[c.Message] = true
		}
		for i, st := range s.Steps {
			if d.file.Generate {
				sent[st.Command] = true
				sent[st.Compensation] = true
			}
			for _, m := range slices.Concat([]*Message{st.Command, st.Compensation}, st.Success, st.Failure) {
				used[m] = true
			}
			sp := path(d.base, sagaSteps, int32(i))
			for _, l := range []struct {
				field int32
				ms    []*Message
			}{
				{stepSuccess, st.Success}, {stepFailure, st.Failure},
				{stepCompensationReply, []*Message{st.CompensationReply}}, {stepCompensationFailure, st.CompensationFailure},
				{stepChild, childReview(st)},
			} {
				for j, r := range l.ms {
					if r == nil {
						continue
					}
					w := &waiter{d: d, step: st.Name, p: path(sp, l.field, int32(j))}
					prev := waited[r]
					if prev == nil {
						waited[r] = w
						continue
					}
					// Within one saga this is saga-ambiguous; events may
					// have any number of subscribers.
					if prev.d == d || r.Kind != sagav1.Kind_KIND_REPLY {
						continue
					}
					at := w
					if !d.file.Generate {
						at, prev = prev, w
					}
					b.errorf(at.d.file, at.p, "reply-consumer", "give each saga its own reply messages; a reply is routed to the queue of the one saga that waits for it",
						"reply %s is awaited by saga %s (step %s) and by saga %s (step %s); both queues would bind it and each engine would park the copies meant for the other",
						r.FullName, prev.d.saga.FullName, prev.step, at.d.saga.FullName, at.step)
				}
			}
		}
	}
	msgs := b.sortedMessages()
	for _, m := range msgs {
		if m.Kind != sagav1.Kind_KIND_COMMAND {
			continue
		}
		cs := consumers[m]
		owners := 0
		if m.Owner != "" {
			owners = 1
			var others []string
			for _, d := range b.sagas {
				// A start command with an owner is a saga-start
				// finding (startOwner). The saga's own queue consumes
				// its cancel command, whatever its owner.
				if c := d.saga.Cancel; c != nil && c.Message == m {
					others = append(others, "saga "+d.saga.FullName+" (cancel, service "+d.saga.Service+")")
				}
			}
			cs = others
		}
		base := path(m.Proto.Location.Path, fieldMessageOptions, extMessage)
		switch n := owners + len(cs); {
		case n == 0 && !sent[m]:
			b.errorf(m.File, base, "command-consumer", "set owner: \"<service that handles it>\"",
				"command %s has no consumer", m.FullName)
		case n > 1:
			who := cs
			if m.Owner != "" {
				who = append([]string{"owner " + m.Owner}, cs...)
			}
			hint := "a command has exactly one consumer: give each saga its own start command, or start the sagas from an event"
			if slices.ContainsFunc(cs, func(c string) bool { return strings.HasSuffix(c, ")") && strings.Contains(c, " (cancel, ") }) {
				hint = "a cancel command is consumed by its saga's queue: leave its owner unset, and give each saga its own cancel command (or cancel with an event)"
			}
			b.errorf(m.File, base, "command-consumer", hint,
				"command %s has %d consumers: %s", m.FullName, n, strings.Join(who, ", "))
		}
	}
	answered := map[*Message]bool{}
	for _, m := range msgs {
		if m.Answers != nil {
			answered[m.Answers] = true
		}
	}
	const sameRequest = "; a saga in another file counts only when it is in the same generation request (buf: strategy: all)"
	for _, m := range msgs {
		at := path(m.Proto.Location.Path, fieldMessageOptions, extMessage)
		switch {
		case m.Kind == sagav1.Kind_KIND_REPLY && waited[m] == nil:
			b.report(m.File, at, true, "reply-unused",
				"list it in a saga step's success, failure or compensation replies, or remove it"+sameRequest,
				"reply %s is not awaited by any saga step", m.FullName)
		case m.Kind == sagav1.Kind_KIND_COMMAND && m.Owner != "" && !used[m] && !answered[m]:
			// Without an owner, it has no consumer (command-consumer).
			b.report(m.File, at, true, "command-unused",
				fmt.Sprintf("send it from a saga step, declare the reply that answers it (answers: %q), or remove it", m.Proto.Desc.Name())+sameRequest,
				"command %s (owner %s) is sent by no saga step and answered by no reply: its participant method has no reply to return and nothing in the contract sends it", m.FullName, m.Owner)
		case m.Kind == sagav1.Kind_KIND_EVENT && !used[m] && len(m.Subscribers) == 0:
			b.report(m.File, at, true, "event-unused",
				"start a saga with it, list it in an external step's success or failure, cancel a saga with it, or name its subscribers (subscribers: [\"<service>\"]); or remove it"+sameRequest,
				"event %s is consumed by no saga and has no subscribers: nothing generated binds a queue to it, so unless a subscriber outside the contract binds one, the relay's mandatory publish of every copy comes back unroutable and is retried", m.FullName)
		}
	}
	b.ownerPackages(msgs)
	b.subscriberQueues(msgs)
	b.queueRetries(msgs)
	b.expiryRetries(msgs)
	type route struct{ exchange, key string }
	routes := map[route]*Message{}
	for _, m := range msgs {
		r := route{m.Exchange, m.RoutingKey}
		if prev, ok := routes[r]; ok {
			b.errorf(m.File, path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgRoutingKey), "routing-key",
				"give each message its own routing key; consumers would receive both types",
				"%s and %s share routing key %q on exchange %q", prev.FullName, m.FullName, m.RoutingKey, m.Exchange)
			continue
		}
		routes[r] = m
	}
	// Results: which replies answer which command.
	for _, d := range b.sagas {
		for _, st := range d.saga.Steps {
			link := func(cmd *Message, rs []*Message) {
				if cmd == nil {
					return
				}
				for _, r := range rs {
					if r != nil {
						cmd.Results = append(cmd.Results, r)
						r.ResultOf = append(r.ResultOf, cmd)
					}
				}
			}
			link(st.Command, slices.Concat(st.Success, st.Failure))
			link(st.Compensation, slices.Concat([]*Message{st.CompensationReply}, st.CompensationFailure))
		}
	}
	for _, m := range msgs {
		if m.Answers != nil {
			m.Answers.Results = append(m.Answers.Results, m)
			m.ResultOf = append(m.ResultOf, m.Answers)
		}
	}
	for _, m := range msgs {
		m.Results = sortMessages(m.Results)
		m.ResultOf = sortMessages(m.ResultOf)
		for _, c := range m.ResultOf {
			if c.Owner != "" && c.File.GoImportPath != m.File.GoImportPath {
				b.errorf(m.File, path(m.Proto.Location.Path, fieldMessageOptions, extMessage), "reply-package",
					"declare replies in the Go package of the command they answer (the participant's contract)",
					"reply %s answers %s but is in Go package %s, not %s; the typed participant result cannot include it",
					m.FullName, c.FullName, m.File.GoImportPath, c.File.GoImportPath)
			}
		}
	}
	// Saga table and queue names must be unique across the request.
	tables := map[string]*Saga{}
	for _, d := range b.sagas {
		s := d.saga
		if prev, ok := tables[s.Table]; ok {
			b.errorf(d.file, path(d.base, sagaName), "name-collision", "rename one saga (name: \"...\")",
				"sagas %s and %s both use table %s", prev.FullName, s.FullName, s.Table)
			continue
		}
		tables[s.Table] = s
	}
}

// ownerPackages refuses a service that owns commands in two Go packages:
// each package generates a participant consuming the queue
// <owner>.commands, so each would receive the other's commands and park
// them. It also checks the length of each owner's queue name.
func (b *builder) ownerPackages(msgs []*Message) {
	first := map[string]*Message{}
	reported := map[string]bool{} // owner + import path
	for _, m := range msgs {
		if m.Kind != sagav1.Kind_KIND_COMMAND || m.Owner == "" {
			continue
		}
		prev := first[m.Owner]
		if prev == nil {
			first[m.Owner] = m
			b.checkQueue(m.File, path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgOwner), "service "+m.Owner,
				ParticipantQueue(m.Owner), "shorten the owner name; its queue is \"<owner>.commands\"")
			continue
		}
		key := m.Owner + " " + string(m.File.GoImportPath)
		if prev.File.GoImportPath == m.File.GoImportPath || reported[key] {
			continue
		}
		reported[key] = true
		at := m
		if !m.File.Generate {
			at, prev = prev, m
		}
		ownerPath := func(x *Message) []int32 {
			return path(x.Proto.Location.Path, fieldMessageOptions, extMessage, msgOwner)
		}
		b.errorf(at.File, ownerPath(at), "owner-package",
			"declare all commands of a service in one Go package, or give the services different names",
			"service %s owns %s in Go package %s and %s (%s) in Go package %s; both packages' participants would consume queue %s and park each other's commands",
			m.Owner, at.FullName, at.File.GoImportPath, prev.FullName, locate(prev.File, ownerPath(prev)), prev.File.GoImportPath, ParticipantQueue(m.Owner))
	}
}

// subscriberQueues checks the queue of each subscribing service: one per
// service and Go package, named after the proto package of its first
// event (by full name). Two Go packages whose subscribers of one service
// would consume the same queue would park each other's events.
func (b *builder) subscriberQueues(msgs []*Message) {
	type key struct {
		service string
		ip      protogen.GoImportPath
	}
	done := map[key]bool{}
	queues := map[string]*Message{}
	for _, m := range msgs {
		for i, svc := range m.Subscribers {
			k := key{svc, m.File.GoImportPath}
			if done[k] {
				continue
			}
			done[k] = true
			p := path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgSubscribers, int32(i))
			q := SubscriberQueue(svc, string(m.File.Desc.Package()))
			b.checkQueue(m.File, p, "subscriber "+svc, q, "shorten the service name or the proto package; the queue is \"<service>.events.<proto package>\"")
			prev, ok := queues[q]
			if !ok {
				queues[q] = m
				continue
			}
			at := m
			if !m.File.Generate {
				at, prev = prev, m
			}
			b.errorf(at.File, p, "name-collision", "declare the events one service subscribes to in one Go package per proto package",
				"subscriber %s of %s (Go package %s) and of %s (Go package %s) would both consume queue %s and park each other's events",
				svc, at.FullName, at.File.GoImportPath, prev.FullName, prev.File.GoImportPath, q)
		}
	}
}

func (b *builder) sortedMessages() []*Message {
	out := make([]*Message, 0, len(b.messages))
	for _, m := range b.messages {
		out = append(out, m)
	}
	slices.SortFunc(out, byFullName)
	return out
}

// finish assembles files, packages and participants and compiles the saga
// definitions. It runs only on an error-free review.
func (b *builder) finish() {
	files := map[*protogen.File]*File{}
	pkgs := map[protogen.GoImportPath]*Package{}
	fileOf := func(pf *protogen.File) *File {
		if f, ok := files[pf]; ok {
			return f
		}
		p := pkgs[pf.GoImportPath]
		if p == nil {
			p = &Package{ImportPath: pf.GoImportPath}
			pkgs[pf.GoImportPath] = p
		}
		f := &File{Proto: pf, Package: p}
		files[pf] = f
		p.Files = append(p.Files, f)
		return f
	}
	for _, m := range b.sortedMessages() {
		if m.Generate {
			f := fileOf(m.File)
			f.Messages = append(f.Messages, m)
		}
	}
	for _, d := range b.sagas {
		if d.saga.Generate {
			f := fileOf(d.file)
			f.Sagas = append(f.Sagas, d.saga)
			d.saga.finish()
		}
	}
	for _, f := range files {
		slices.SortFunc(f.Sagas, func(x, y *Saga) int { return cmp.Compare(x.FullName, y.FullName) })
		b.model.Files = append(b.model.Files, f)
	}
	slices.SortFunc(b.model.Files, func(x, y *File) int { return cmp.Compare(x.Proto.Desc.Path(), y.Proto.Desc.Path()) })
	for _, p := range pkgs {
		slices.SortFunc(p.Files, func(x, y *File) int { return cmp.Compare(x.Proto.Desc.Path(), y.Proto.Desc.Path()) })
		byOwner := map[string]*Participant{}
		for _, f := range p.Files {
			for _, m := range f.Messages {
				if m.Kind != sagav1.Kind_KIND_COMMAND || m.Owner == "" {
					continue
				}
				pt := byOwner[m.Owner]
				if pt == nil {
					pt = &Participant{Owner: m.Owner, GoName: Camel(m.Owner), Queue: ParticipantQueue(m.Owner)}
					byOwner[m.Owner] = pt
					p.Participants = append(p.Participants, pt)
				}
				pt.Commands = append(pt.Commands, m)
				if m.Retry != nil {
					pt.Retry = m.Retry
				}
			}
		}
		slices.SortFunc(p.Participants, func(x, y *Participant) int { return cmp.Compare(x.Owner, y.Owner) })
		bySub := map[string]*Subscriber{}
		for _, f := range p.Files {
			for _, m := range f.Messages {
				for _, svc := range m.Subscribers {
					sb := bySub[svc]
					if sb == nil {
						sb = &Subscriber{Service: svc, GoName: Camel(svc), Queue: SubscriberQueue(svc, string(m.File.Desc.Package()))}
						bySub[svc] = sb
						p.Subscribers = append(p.Subscribers, sb)
					}
					sb.Events = append(sb.Events, m)
					if m.Retry != nil {
						sb.Retry = m.Retry
					}
				}
			}
		}
		for _, sb := range p.Subscribers {
			sb.Events = sortMessages(sb.Events)
			sb.Queue = SubscriberQueue(sb.Service, string(sb.Events[0].File.Desc.Package()))
		}
		slices.SortFunc(p.Subscribers, func(x, y *Subscriber) int { return cmp.Compare(x.Service, y.Service) })
		b.model.Packages = append(b.model.Packages, p)
	}
	slices.SortFunc(b.model.Packages, func(x, y *Package) int { return cmp.Compare(x.ImportPath, y.ImportPath) })
}

func (s *Saga) finish() {
	var handles, commands []*Message
	for _, st := range s.Steps {
		handles = append(handles, st.Success...)
		handles = append(handles, st.Failure...)
		handles = append(handles, st.CompensationFailure...)
		if st.CompensationReply != nil {
			handles = append(handles, st.CompensationReply)
		}
		if st.Child != nil && st.Child.Replies != nil && st.Child.Replies.ManualReview != nil {
			handles = append(handles, st.Child.Replies.ManualReview)
		}
		if st.Command != nil {
			commands = append(commands, st.Command)
		}
		if st.Compensation != nil {
			commands = append(commands, st.Compensation)
		}
	}
	if s.Cancel != nil && s.Cancel.Message != nil {
		handles = append(handles, s.Cancel.Message)
	}
	s.Handles = sortMessages(handles)
	s.Commands = sortMessages(commands)
	s.Consumes = s.Handles
	if s.Start != nil {
		s.Consumes = sortMessages(append(handles, s.Start))
	}
}

func (s *Saga) definition() *sagadef.Definition {
	d := &sagadef.Definition{
		Name: s.FullName, Table: s.Table, DataMessage: string(s.Data.Desc.FullName()), Deadline: s.Deadline,
	}
	if s.Start != nil {
		d.StartMessage = s.Start.FullName
	}
	names := func(ms []*Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.FullName)
		}
		return out
	}
	for _, st := range s.Steps {
		ds := sagadef.Step{
			Name: st.Name, Role: sagadef.Role(st.Role), External: st.External, Conditional: st.Conditional,
			SuccessReplies: names(st.Success), FailureReplies: names(st.Failure),
			CompensationFailureReplies: names(st.CompensationFailure),
			Timeout:                    st.Timeout, OnTimeout: sagadef.TimeoutAction(st.OnTimeout),
			MaxAttempts: st.MaxAttempts, Late: sagadef.LatePolicy(st.Late),
		}
		if st.Command != nil {
			ds.Command = st.Command.FullName
		}
		if st.Group != nil {
			ds.Group = st.Group.Name
		}
		if st.Compensation != nil {
			ds.Compensation = st.Compensation.FullName
		}
		if st.CompensationReply != nil {
			ds.CompensationReply = st.CompensationReply.FullName
		}
		if st.Child != nil {
			ds.Child = st.Child.FullName
			if r := st.Child.Replies; r != nil && r.ManualReview != nil {
				ds.ChildReview = r.ManualReview.FullName
			}
		}
		d.Steps = append(d.Steps, ds)
	}
	for _, g := range s.Groups {
		d.Groups = append(d.Groups, sagadef.Group{Name: g.Name, Timeout: g.Timeout})
	}
	if c := s.Cancel; c != nil && c.Message != nil {
		d.Cancel.Message = c.Message.FullName
		if c.RequestedBy != nil {
			d.Cancel.RequestedBy = c.RequestedBy.Path
		}
		if c.Reason != nil {
			d.Cancel.Reason = c.Reason.Path
		}
	}
	if r := s.Replies; r != nil && r.Completed != nil && r.Failed != nil {
		d.Replies = sagadef.Replies{Completed: r.Completed.FullName, Failed: r.Failed.FullName}
		if r.Cancelled != nil {
			d.Replies.Cancelled = r.Cancelled.FullName
		}
		if r.ManualReview != nil {
			d.Replies.ManualReview = r.ManualReview.FullName
		}
	}
	if c := s.Callback; c != nil && (c.URLField != nil || c.ClientField != nil) && len(c.States) > 0 {
		d.Callback = sagadef.Callback{States: c.States, IncludeData: c.IncludeData}
		if c.URLField != nil {
			d.Callback.URLField = c.URLField.Path
		}
		if c.ClientField != nil {
			d.Callback.ClientField = c.ClientField.Path
		}
	}
	return d
}

// childReview lists the manual-review reply of a child step's child, which
// the parent's queue receives like the step's replies.
func childReview(st *Step) []*Message {
	if st.Child == nil || st.Child.Replies == nil || st.Child.Replies.ManualReview == nil {
		return nil
	}
	return []*Message{st.Child.Replies.ManualReview}
}
