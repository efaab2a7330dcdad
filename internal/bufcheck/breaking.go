package bufcheck

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"buf.build/go/bufplugin/check"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/protosaga/saga/internal/gen/model"
	sagav1 "github.com/protosaga/saga/options/saga/v1"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Breaking rule ids.
const (
	RuleSagaNoDelete              = "SAGA_NO_DELETE"
	RuleSagaSameName              = "SAGA_SAME_NAME"
	RuleSagaSameService           = "SAGA_SAME_SERVICE"
	RuleSagaSameStart             = "SAGA_SAME_START"
	RuleSagaSameBusinessKey       = "SAGA_SAME_BUSINESS_KEY"
	RuleStepNoDelete              = "SAGA_STEP_NO_DELETE"
	RuleStepSameName              = "SAGA_STEP_SAME_NAME"
	RuleStepSameOrder             = "SAGA_STEP_SAME_ORDER"
	RuleStepSameRole              = "SAGA_STEP_SAME_ROLE"
	RuleStepSameCommand           = "SAGA_STEP_SAME_COMMAND"
	RuleStepSameReplies           = "SAGA_STEP_SAME_REPLIES"
	RuleStepSameLateReply         = "SAGA_STEP_SAME_LATE_REPLY"
	RuleMessageSameRouting        = "SAGA_MESSAGE_SAME_ROUTING"
	RuleMessageSameCorrelation    = "SAGA_MESSAGE_SAME_CORRELATION"
	RuleCommandSameIdempotencyKey = "SAGA_COMMAND_SAME_IDEMPOTENCY_KEY"
	RuleCommandSameOwner          = "SAGA_COMMAND_SAME_OWNER"
	RuleExchangeSameType          = "SAGA_EXCHANGE_SAME_TYPE"
)

// breakingRules lists the breaking rules in the order docs/design-review.md
// presents them.
var breakingRules = []struct{ id, purpose string }{
	{RuleSagaNoDelete, "Checks that no saga is removed while instances may be in flight."},
	{RuleSagaSameName, "Checks that a saga keeps its name, which keys its table, queue and saga type."},
	{RuleSagaSameService, "Checks that a saga keeps its service, which names its queue."},
	{RuleSagaSameStart, "Checks that a saga keeps the message that starts it."},
	{RuleSagaSameBusinessKey, "Checks that a saga keeps the field its unique business key is read from."},
	{RuleStepNoDelete, "Checks that no step is removed, with the states instances may occupy."},
	{RuleStepSameName, "Checks that a step keeps its name, which its states and the instances' progress record."},
	{RuleStepSameOrder, "Checks that steps keep their relative order."},
	{RuleStepSameRole, "Checks that a step keeps its role (compensatable, pivot, retriable)."},
	{RuleStepSameCommand, "Checks that a step keeps the command it sends and the command that compensates it."},
	{RuleStepSameReplies, "Checks that a step keeps waiting for every reply or event it waited for, in the same part."},
	{RuleStepSameLateReply, "Checks that a step's late-reply policy is not removed or changed, except to manual review."},
	{RuleMessageSameRouting, "Checks that a message keeps its exchange and routing key."},
	{RuleMessageSameCorrelation, "Checks that a message keeps its correlation field."},
	{RuleCommandSameIdempotencyKey, "Checks that a command keeps the fields its idempotency key is built from."},
	{RuleCommandSameOwner, "Checks that a command keeps its owner service, which names its queue."},
	{RuleExchangeSameType, "Checks that an exchange keeps its AMQP type (direct or topic)."},
}

// place is a position in one side's contract: a file and a source path in
// it (nil: the whole file).
type place struct {
	file string
	path []int32
}

// change is one finding of a breaking rule.
type change struct {
	rule    string
	message string
	// at is where the change is in the contract; nil when what changed is
	// gone with its file.
	at *place
	// was is where the changed element was in the against contract.
	was *place
}

// breakingHandler reports the changes found under rule.
func breakingHandler(rule string) check.RuleHandler {
	return check.RuleHandlerFunc(func(ctx context.Context, rw check.ResponseWriter, req check.Request) error {
		changes, err := sessionFor(ctx, req).compare()
		if err != nil {
			return err
		}
		for _, c := range changes {
			if c.rule != rule {
				continue
			}
			opts := []check.AddAnnotationOption{check.WithMessage(c.message)}
			if c.at != nil {
				opts = append(opts, check.WithFileNameAndSourcePath(c.at.file, c.at.path))
			}
			if c.was != nil {
				opts = append(opts, check.WithAgainstFileNameAndSourcePath(c.was.file, c.was.path))
			}
			rw.AddAnnotation(opts...)
		}
		return nil
	})
}

// compare returns the changes between the request's against files and its
// files. A request without against files has none.
func (s *session) compare() ([]change, error) {
	s.compareOnce.Do(func() {
		if len(s.req.AgainstFileDescriptors()) == 0 {
			return
		}
		cur, err := s.contract()
		if err != nil {
			s.compareErr = err
			return
		}
		against, err := newContract(s.req.AgainstFileDescriptors())
		if err != nil {
			s.compareErr = fmt.Errorf("against contract: %w", err)
			return
		}
		newModel, err := cur.model()
		if err != nil {
			s.compareErr = err
			return
		}
		oldModel, err := against.model()
		if err != nil {
			s.compareErr = fmt.Errorf("against contract: %w", err)
			return
		}
		s.changes = compareModels(oldModel, newModel, cur)
	})
	return s.changes, s.compareErr
}

// Field numbers of the saga.v1 options, read from their descriptors.
var (
	extMessage = int32(sagav1.E_Message.TypeDescriptor().Number())
	extSaga    = int32(sagav1.E_Saga.TypeDescriptor().Number())

	messageFields = (&sagav1.Message{}).ProtoReflect().Descriptor().Fields()
	sagaFields    = (&sagav1.Saga{}).ProtoReflect().Descriptor().Fields()
	stepFields    = (&sagav1.Step{}).ProtoReflect().Descriptor().Fields()
)

func number(fields protoreflect.FieldDescriptors, name protoreflect.Name) int32 {
	return int32(fields.ByName(name).Number())
}

// optionsPath is the source path of message m's options.
func optionsPath(m *protogen.Message) []int32 {
	const messageOptions = 7 // DescriptorProto.options
	return append(slices.Clone(m.Location.Path), messageOptions)
}

func messagePlace(m *model.Message, field protoreflect.Name) *place {
	p := append(optionsPath(m.Proto), extMessage)
	if field != "" {
		p = append(p, number(messageFields, field))
	}
	return &place{file: m.File.Desc.Path(), path: p}
}

func sagaPlace(s *model.Saga, field protoreflect.Name) *place {
	p := append(optionsPath(s.Data), extSaga)
	if field != "" {
		p = append(p, number(sagaFields, field))
	}
	return &place{file: s.File.Desc.Path(), path: p}
}

func stepPlace(s *model.Saga, i int, field protoreflect.Name) *place {
	p := append(sagaPlace(s, "steps").path, int32(i))
	if field != "" {
		p = append(p, number(stepFields, field))
	}
	return &place{file: s.File.Desc.Path(), path: p}
}

// sagas returns the sagas of m's files (not of their imports) by full name.
func sagas(m *model.Model) map[string]*model.Saga {
	out := map[string]*model.Saga{}
	for _, f := range m.Files {
		for _, s := range f.Sagas {
			out[s.FullName] = s
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// compareModels returns every change from old to cur, sorted by rule and
// message. cur is the contract of the new side (for file look-ups).
func compareModels(old, cur *model.Model, c *contract) []change {
	var out []change
	add := func(rule string, at, was *place, format string, args ...any) {
		out = append(out, change{rule: rule, message: fmt.Sprintf(format, args...), at: at, was: was})
	}
	oldSagas, curSagas := sagas(old), sagas(cur)
	byData := map[string]*model.Saga{}
	for _, s := range curSagas {
		byData[string(s.Data.Desc.FullName())] = s
	}
	for _, name := range sortedKeys(oldSagas) {
		o := oldSagas[name]
		if n := curSagas[name]; n != nil {
			compareSaga(add, o, n)
			continue
		}
		if n := byData[string(o.Data.Desc.FullName())]; n != nil && oldSagas[n.FullName] == nil {
			at := sagaPlace(n, "name")
			var also string
			if o.Queue != n.Queue {
				also = fmt.Sprintf(" and queue (%s → %s)", o.Queue, n.Queue)
			}
			add(RuleSagaSameName, at, sagaPlace(o, ""),
				"saga %s is renamed %s: the name keys its table (%s → %s)%s and the saga type its messages carry, so instances in flight stay in %s, which the renamed saga never reads, and their replies continue nothing; keep name: %q until no instance is in flight",
				o.FullName, n.FullName, o.Table, n.Table, also, o.Table, o.Name)
			continue
		}
		var at *place
		if _, ok := c.files[o.File.Desc.Path()]; ok {
			at = &place{file: o.File.Desc.Path()}
		}
		add(RuleSagaNoDelete, at, sagaPlace(o, ""),
			"saga %s is removed: no release consumes its queue %s or scans its table %s any more, so an instance not yet COMPLETED, FAILED or CANCELLED stays where it is (its replies are never consumed, its timeouts and deadline never fire); keep the saga until no instance is in flight",
			o.FullName, o.Queue, o.Table)
	}
	compareMessages(add, old, cur)
	slices.SortStableFunc(out, func(a, b change) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.message, b.message))
	})
	return out
}

type adder func(rule string, at, was *place, format string, args ...any)

func compareSaga(add adder, o, n *model.Saga) {
	if o.Queue != n.Queue {
		add(RuleSagaSameService, sagaPlace(n, "service"), sagaPlace(o, "service"),
			"saga %s moves from service %q to %q, so its queue becomes %s (was %s): replies and events already queued in %s for instances in flight are never consumed by the new release",
			n.FullName, o.Service, n.Service, n.Queue, o.Queue, o.Queue)
	}
	sameStart := true
	if o.Start != nil && n.Start != nil && o.Start.FullName != n.Start.FullName {
		sameStart = false
		add(RuleSagaSameStart, sagaPlace(n, "start"), sagaPlace(o, "start"),
			"saga %s starts from %s instead of %s: start requests already queued or in outboxes, and those from clients not yet upgraded, no longer start it, so those business operations never start",
			n.FullName, n.Start.FullName, o.Start.FullName)
	}
	if sameStart && o.BusinessKey != nil && n.BusinessKey != nil && !slices.Equal(numbers(o.BusinessKey), numbers(n.BusinessKey)) {
		add(RuleSagaSameBusinessKey, sagaPlace(n, "business_key"), sagaPlace(o, "business_key"),
			"saga %s reads its business key from %s instead of %s: instances in flight hold the old field's value as their business key, so a start request repeated for an operation already in flight is not recognised as the same operation and starts it a second time",
			n.FullName, fieldRef(n.BusinessKey), fieldRef(o.BusinessKey))
	}
	compareSteps(add, o, n)
}

// numbers returns the field numbers along a field path.
func numbers(p *model.FieldPath) []int32 {
	out := make([]int32, len(p.Fields))
	for i, f := range p.Fields {
		out[i] = int32(f.Desc.Number())
	}
	return out
}

// fieldRef names a field path with its field numbers: "order.id (#2.1)".
func fieldRef(p *model.FieldPath) string {
	nums := make([]string, len(p.Fields))
	for i, f := range p.Fields {
		nums[i] = fmt.Sprint(f.Desc.Number())
	}
	return fmt.Sprintf("%s (#%s)", p.Path, strings.Join(nums, "."))
}

func fieldRefs(ps []*model.FieldPath) string {
	refs := make([]string, len(ps))
	for i, p := range ps {
		refs[i] = fieldRef(p)
	}
	return "[" + strings.Join(refs, ", ") + "]"
}

func roleName(r sagav1.Role) string {
	if r == sagav1.Role_ROLE_UNSPECIFIED {
		return "no role"
	}
	return sagadef.Role(r).String()
}

func lateName(l sagav1.LateReply) string {
	switch l {
	case sagav1.LateReply_LATE_REPLY_IGNORE:
		return "ignore (audit only)"
	case sagav1.LateReply_LATE_REPLY_MANUAL_REVIEW:
		return "manual review"
	case sagav1.LateReply_LATE_REPLY_APPLY_IF_WAITING:
		return "apply if still waiting"
	}
	return "none"
}

// stateNames lists the states a step's instances may occupy.
func stateNames(st *model.Step) string {
	if st.Role == sagav1.Role_ROLE_COMPENSATABLE {
		return sagadef.StateName(st.Name) + " or " + sagadef.CompensatingStateName(st.Name)
	}
	return sagadef.StateName(st.Name)
}

func stepIndex(s *model.Saga, name string) int {
	return slices.IndexFunc(s.Steps, func(st *model.Step) bool { return st.Name == name })
}

// renamed reports whether cur is old under another name: it sends the same
// command, or (both waiting for events) waits for one of the same events.
func renamed(old, cur *model.Step) bool {
	if old.Command != nil || cur.Command != nil {
		return old.Command != nil && cur.Command != nil && old.Command.FullName == cur.Command.FullName
	}
	return slices.ContainsFunc(old.Success, func(m *model.Message) bool { return containsName(cur.Success, m.FullName) })
}

func containsName(ms []*model.Message, name string) bool {
	return slices.ContainsFunc(ms, func(m *model.Message) bool { return m.FullName == name })
}

func compareSteps(add adder, o, n *model.Saga) {
	taken := map[string]bool{}
	for i, st := range o.Steps {
		if st.Name == "" {
			continue
		}
		if j := stepIndex(n, st.Name); j >= 0 {
			compareStep(add, n, j, o, i)
			continue
		}
		var compensation string
		if st.Role == sagav1.Role_ROLE_COMPENSATABLE {
			compensation = ", and an instance that ran it and later compensates cannot send its compensation: it goes to MANUAL_REVIEW"
		}
		j := slices.IndexFunc(n.Steps, func(c *model.Step) bool {
			return !taken[c.Name] && stepIndex(o, c.Name) < 0 && renamed(st, c)
		})
		if j >= 0 {
			to := n.Steps[j]
			taken[to.Name] = true
			states := fmt.Sprintf("instances waiting in %s cannot continue (the new states migration refuses to apply while any instance is in it)", stateNames(st))
			if sagadef.StateName(st.Name) == sagadef.StateName(to.Name) && st.Role == to.Role {
				states = "instances that ran it record it under its old name"
			}
			add(RuleStepSameName, stepPlace(n, j, "name"), stepPlace(o, i, "name"),
				"saga %s: step %s is renamed %s: instances record the steps they ran by name and wait in states named after them, so %s%s; keep the name until no instance in flight has reached the step",
				n.FullName, st.Name, to.Name, states, compensation)
			continue
		}
		add(RuleStepNoDelete, sagaPlace(n, ""), stepPlace(o, i, ""),
			"saga %s: step %s is removed: instances waiting in %s cannot continue (the new states migration refuses to apply while any instance is in it)%s; remove it once no instance in flight has reached it",
			n.FullName, st.Name, stateNames(st), compensation)
	}
	// Relative order of the steps both versions have.
	for j, st := range n.Steps {
		i := stepIndex(o, st.Name)
		if i < 0 {
			continue
		}
		var overtaken []string
		for _, later := range n.Steps[j+1:] {
			if k := stepIndex(o, later.Name); k >= 0 && k < i {
				overtaken = append(overtaken, later.Name)
			}
		}
		if len(overtaken) == 0 {
			continue
		}
		add(RuleStepSameOrder, stepPlace(n, j, ""), stepPlace(o, i, ""),
			"saga %s: step %s now runs before %s (it ran after): an instance continues after a step with the steps that follow it in the new order, so instances waiting on %s when this deploys never run %s",
			n.FullName, st.Name, strings.Join(overtaken, ", "), strings.Join(overtaken, " or "), st.Name)
	}
}

func compareStep(add adder, n *model.Saga, j int, o *model.Saga, i int) {
	ns, os := n.Steps[j], o.Steps[i]
	if os.Role != sagav1.Role_ROLE_UNSPECIFIED && ns.Role != sagav1.Role_ROLE_UNSPECIFIED && os.Role != ns.Role {
		var effects []string
		if os.Role == sagav1.Role_ROLE_COMPENSATABLE {
			effects = append(effects,
				"instances that ran it are no longer compensated when a later step fails (its effect stays in place)",
				fmt.Sprintf("instances compensating it in %s cannot continue (the new states migration refuses to apply while any instance is in it)", sagadef.CompensatingStateName(os.Name)))
		}
		if ns.Role == sagav1.Role_ROLE_COMPENSATABLE {
			effects = append(effects, "instances that ran it under the old role treated its effect as final, and now undo it when they compensate (after a later failure, a cancel, or an operator's compensate)")
		}
		retriable := os.Role == sagav1.Role_ROLE_RETRIABLE || ns.Role == sagav1.Role_ROLE_RETRIABLE
		if os.Role != sagav1.Role_ROLE_COMPENSATABLE && ns.Role != sagav1.Role_ROLE_COMPENSATABLE && retriable {
			other := os.Role
			if other == sagav1.Role_ROLE_RETRIABLE {
				other = ns.Role
			}
			effects = append(effects, fmt.Sprintf("a failure reply to an instance waiting on it does something else: a %s's failure compensates the steps before it, a retriable step's goes to MANUAL_REVIEW", roleName(other)))
		}
		if (os.Role == sagav1.Role_ROLE_CHECK) != (ns.Role == sagav1.Role_ROLE_CHECK) && !retriable &&
			(os.Role == sagav1.Role_ROLE_PIVOT || ns.Role == sagav1.Role_ROLE_PIVOT) {
			effects = append(effects, "a business cancel of an instance that completed it does something else: after a completed pivot it is refused (the point of no return passed), after a completed check it compensates")
		}
		add(RuleStepSameRole, stepPlace(n, j, "role"), stepPlace(o, i, "role"),
			"saga %s: step %s changes role from %s to %s: %s",
			n.FullName, ns.Name, roleName(os.Role), roleName(ns.Role), strings.Join(effects, "; "))
	}
	if os.Command != nil && ns.Command != nil && os.Command.FullName != ns.Command.FullName {
		add(RuleStepSameCommand, stepPlace(n, j, "command"), stepPlace(o, i, "command"),
			"saga %s: step %s sends %s instead of %s: instances waiting on it sent %s, and a resend (retry on timeout, an operator's retry) sends %s with its own idempotency key, which its participant cannot relate to the first, so the effect can happen twice",
			n.FullName, ns.Name, ns.Command.FullName, os.Command.FullName, os.Command.FullName, ns.Command.FullName)
	}
	if os.Compensation != nil && ns.Compensation != nil && os.Compensation.FullName != ns.Compensation.FullName {
		add(RuleStepSameCommand, stepPlace(n, j, "compensation"), stepPlace(o, i, "compensation"),
			"saga %s: step %s is compensated by %s instead of %s: instances that ran the step under the old contract are compensated with %s, which must undo what the old release did; keep %s until no instance in flight has run the step",
			n.FullName, ns.Name, ns.Compensation.FullName, os.Compensation.FullName, ns.Compensation.FullName, os.Compensation.FullName)
	}
	compareReplies(add, n, j, o, i)
	if os.Late != sagav1.LateReply_LATE_REPLY_UNSPECIFIED && ns.Late != os.Late && ns.Late != sagav1.LateReply_LATE_REPLY_MANUAL_REVIEW {
		effect := "late replies to instances in flight follow the new policy"
		if os.Late == sagav1.LateReply_LATE_REPLY_MANUAL_REVIEW {
			effect = "a reply arriving after an instance in flight stopped waiting (timed out, compensating) no longer goes to MANUAL_REVIEW: no one decides what its effect, which may have happened past the point of no return, means for the saga"
		} else if ns.Late == sagav1.LateReply_LATE_REPLY_UNSPECIFIED {
			effect = "what a late reply does to an instance in flight is undefined"
		}
		at := stepPlace(n, j, "late_reply")
		if ns.Late == sagav1.LateReply_LATE_REPLY_UNSPECIFIED {
			at = stepPlace(n, j, "")
		}
		add(RuleStepSameLateReply, at, stepPlace(o, i, "late_reply"),
			"saga %s: step %s changes its late-reply policy from %s to %s: %s; only a change to manual review is safe for sagas in flight",
			n.FullName, ns.Name, lateName(os.Late), lateName(ns.Late), effect)
	}
}

// compareReplies reports every reply or event the old step waited for that
// the new step no longer waits for in the same part.
func compareReplies(add adder, n *model.Saga, j int, o *model.Saga, i int) {
	ns, os := n.Steps[j], o.Steps[i]
	reply := "reply"
	if os.External {
		reply = "event"
	}
	type part struct {
		name     string
		field    protoreflect.Name
		old, cur []*model.Message
	}
	one := func(m *model.Message) []*model.Message {
		if m == nil {
			return nil
		}
		return []*model.Message{m}
	}
	parts := []part{
		{"success " + reply, "success", os.Success, ns.Success},
		{"failure " + reply, "failure", os.Failure, ns.Failure},
	}
	if ns.Compensation != nil && os.Compensation != nil {
		parts = append(parts,
			part{"compensation reply", "compensation_reply", one(os.CompensationReply), one(ns.CompensationReply)},
			part{"compensation failure reply", "compensation_failure", os.CompensationFailure, ns.CompensationFailure})
	}
	for _, p := range parts {
		for _, m := range p.old {
			if containsName(p.cur, m.FullName) {
				continue
			}
			effect := "the saga no longer takes it as an answer (it has no effect) and the instance waits until the step times out"
			for _, q := range parts {
				if containsName(q.cur, m.FullName) {
					effect = "a copy arriving for an instance in flight is now taken as the step's " + q.name
				}
			}
			add(RuleStepSameReplies, stepPlace(n, j, p.field), stepPlace(o, i, p.field),
				"saga %s: step %s no longer waits for %s as its %s: instances in flight may still receive it for a command sent before this deploys; %s",
				n.FullName, ns.Name, m.FullName, p.name, effect)
		}
	}
}

// compareMessages compares the annotated messages of both versions' files.
func compareMessages(add adder, old, cur *model.Model) {
	exchanges := func(m *model.Model) map[string]*model.Message {
		out := map[string]*model.Message{}
		for _, name := range sortedKeys(m.Messages) {
			msg := m.Messages[name]
			if msg.Generate && out[msg.Exchange] == nil {
				out[msg.Exchange] = msg
			}
		}
		return out
	}
	for _, name := range sortedKeys(old.Messages) {
		o, n := old.Messages[name], cur.Messages[name]
		if !o.Generate || n == nil || !n.Generate {
			continue
		}
		if o.Exchange != n.Exchange || o.RoutingKey != n.RoutingKey {
			field := protoreflect.Name("routing_key")
			if o.Exchange != n.Exchange {
				field = "exchange"
			}
			add(RuleMessageSameRouting, messagePlace(n, field), messagePlace(o, field),
				"%s is published to exchange %q with routing key %q, was %q with %q: outbox rows written before this deploys and services not yet upgraded still use the old ones, which reach a consumer only while the broker keeps the old binding (a broker declared from the new topology returns them as unroutable), and consumers that bound the old routing key stop receiving it",
				n.FullName, n.Exchange, n.RoutingKey, o.Exchange, o.RoutingKey)
		}
		if o.Correlation != nil && (n.Correlation == nil || !slices.Equal(numbers(o.Correlation), numbers(n.Correlation))) {
			now := "declares no correlation field"
			if n.Correlation != nil {
				now = "correlates by " + fieldRef(n.Correlation)
			}
			add(RuleMessageSameCorrelation, messagePlace(n, "correlation_field"), messagePlace(o, "correlation_field"),
				"%s %s instead of %s: copies published before this deploys, or by services not yet upgraded, carry the saga's key in the old field, so the engine cannot find the saga of such an event or cancel request (it parks it) and operators no longer join parked copies to their saga",
				n.FullName, now, fieldRef(o.Correlation))
		}
		if o.Kind != sagav1.Kind_KIND_COMMAND || n.Kind != sagav1.Kind_KIND_COMMAND {
			continue
		}
		if len(o.IdempotencyKey) > 0 && !slices.EqualFunc(o.IdempotencyKey, n.IdempotencyKey, func(a, b *model.FieldPath) bool {
			return slices.Equal(numbers(a), numbers(b))
		}) {
			add(RuleCommandSameIdempotencyKey, messagePlace(n, "idempotency_key"), messagePlace(o, "idempotency_key"),
				"command %s builds its idempotency key from %s instead of %s: a command resent for an instance in flight (retry on timeout, an operator's retry or replay) carries a key its participant never saw for that operation, so it performs the effect a second time",
				n.FullName, fieldRefs(n.IdempotencyKey), fieldRefs(o.IdempotencyKey))
		}
		if o.Owner != "" && o.Owner != n.Owner {
			to := fmt.Sprintf("service %q, so its queue becomes %s", n.Owner, model.ParticipantQueue(n.Owner))
			if n.Owner == "" {
				to = "no service"
			}
			add(RuleCommandSameOwner, messagePlace(n, "owner"), messagePlace(o, "owner"),
				"command %s moves from service %q (queue %s) to %s: copies already queued in %s for instances in flight reach a participant that no longer handles the command (it parks them), and their steps wait until they time out",
				n.FullName, o.Owner, model.ParticipantQueue(o.Owner), to, model.ParticipantQueue(o.Owner))
		}
	}
	oldEx, curEx := exchanges(old), exchanges(cur)
	for _, ex := range sortedKeys(oldEx) {
		o, n := oldEx[ex], curEx[ex]
		if n == nil || o.ExchangeKind == n.ExchangeKind {
			continue
		}
		why := "no event is published to it any more"
		if n.ExchangeKind == "topic" {
			why = "an event is now published to it"
		}
		add(RuleExchangeSameType, messagePlace(n, "exchange"), messagePlace(o, "exchange"),
			"exchange %q changes type from %s to %s (%s): RabbitMQ refuses to redeclare an existing exchange with another type (PRECONDITION_FAILED), so the new release cannot declare its topology on a broker the old one set up",
			ex, o.ExchangeKind, n.ExchangeKind, why)
	}
}
