package model

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/compiler/protogen"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// Field numbers of saga.v1.Group and the group fields of Saga and Step.
const (
	sagaGroups   = 10
	stepGroup    = 15
	groupName    = 1
	groupTimeout = 2
)

// groups resolves a saga's parallel groups (Saga.groups, Step.group) and
// reviews them: every group is declared once under a CamelCase name no step
// has, names at least two consecutive steps, none of them the pivot, waits
// at least as long as each member may (rules group-reference,
// group-members, group-timeout), and has members the runtime can run
// together (rule group-execution).
func (b *builder) groups(f *protogen.File, base []int32, s *Saga, o *sagav1.Saga) {
	byName := map[string]*Group{}
	for i, gd := range o.GetGroups() {
		p := path(base, sagaGroups, int32(i))
		g := &Group{Name: gd.GetName()}
		switch {
		case g.Name == "":
			b.errorf(f, p, "group-reference", "add name: \"<CamelCase group name>\"",
				"saga %s: group #%d has no name", s.FullName, i+1)
			continue
		case !camelRE.MatchString(g.Name):
			b.errorf(f, path(p, groupName), "group-reference", "use a CamelCase name such as \"ReserveTrip\"",
				"saga %s: invalid group name %q", s.FullName, g.Name)
			continue
		case byName[g.Name] != nil:
			b.errorf(f, path(p, groupName), "group-reference", "declare each group once",
				"saga %s: group %s is declared twice", s.FullName, g.Name)
			continue
		}
		for _, st := range s.Steps {
			if st.Name == g.Name {
				b.errorf(f, path(p, groupName), "group-reference", "rename the group: its state is named after it, like a step's",
					"saga %s: group %s has the name of a step", s.FullName, g.Name)
			}
		}
		if gd.GetTimeout() == "" {
			g.bad = true
			b.errorf(f, p, "group-timeout", "add timeout: \"5m\" (Go duration), at least the longest wait of a member",
				"saga %s: group %s has no timeout", s.FullName, g.Name)
		} else {
			g.Timeout = b.duration(f, path(p, groupTimeout), fmt.Sprintf("saga %s: group %s: ", s.FullName, g.Name), gd.GetTimeout(), "timeout")
		}
		if g.Timeout == 0 {
			g.bad = true
		}
		g.index = i
		byName[g.Name] = g
		s.Groups = append(s.Groups, g)
	}
	var prev *Group
	for i, so := range o.GetSteps() {
		if i >= len(s.Steps) {
			break
		}
		st, p := s.Steps[i], path(base, sagaSteps, int32(i), stepGroup)
		name := so.GetGroup()
		if name == "" {
			prev = nil
			continue
		}
		g := byName[name]
		if g == nil {
			declared := make([]string, 0, len(s.Groups))
			for _, g := range s.Groups {
				declared = append(declared, g.Name)
			}
			b.errorf(f, p, "group-reference", didYouMean(name, declared, fmt.Sprintf("declare it in the saga's groups: {name: %q, timeout: \"5m\"}", name)),
				"saga %s: step %s names group %q, which the saga does not declare", s.FullName, st.Name, name)
			prev = nil
			continue
		}
		if len(g.Steps) > 0 && prev != g {
			g.bad = true
			b.errorf(f, p, "group-members", "move the step next to the other members: a group is one run of consecutive steps",
				"saga %s: step %s joins group %s, whose earlier members (%s) are not right before it", s.FullName, st.Name, g.Name, stepNames(g.Steps))
		}
		if st.Role == sagav1.Role_ROLE_PIVOT {
			g.bad = true
			b.errorf(f, p, "group-members", "take the pivot out of the group: it runs alone, after the steps it depends on",
				"saga %s: pivot %s is a member of group %s: the point of no return would be passed while members that may still fail are running", s.FullName, st.Name, g.Name)
		}
		st.Group = g
		g.Steps = append(g.Steps, st)
		prev = g
	}
	for _, g := range s.Groups {
		p := path(base, sagaGroups, int32(g.index))
		mark := len(b.diags)
		switch len(g.Steps) {
		case 0:
			b.errorf(f, p, "group-members", "name the group in the steps that run together (group: \""+g.Name+"\"), or remove it",
				"saga %s: no step is a member of group %s", s.FullName, g.Name)
			continue
		case 1:
			b.errorf(f, p, "group-members", "add another member, or remove the group: one step runs alone",
				"saga %s: group %s has one member, %s", s.FullName, g.Name, g.Steps[0].Name)
			continue
		}
		if g.Timeout > 0 {
			for _, st := range g.Steps {
				if w := memberWait(st); w > g.Timeout {
					b.errorf(f, path(p, groupTimeout), "group-timeout", fmt.Sprintf("raise the group's timeout to %s or more, or shorten the member's", durationString(w)),
						"saga %s: group %s times out after %s, before its member %s stops waiting (%s): the member's own timeout policy would never apply",
						s.FullName, g.Name, g.Timeout, st.Name, memberWaitText(st))
				}
			}
		}
		if b.errorsSince(mark) || g.bad {
			continue
		}
		b.groupExecution(f, base, s, o, g)
	}
}

// groupExecution refuses members the runtime cannot run together (rule
// group-execution): an external step (it sends no command to dispatch
// with the others), a conditional step (a member always runs), and
// members on both sides of the point of no return (retriable members with
// compensatable or check ones: a failure would have to both compensate
// and not).
func (b *builder) groupExecution(f *protogen.File, base []int32, s *Saga, o *sagav1.Saga, g *Group) {
	at := func(st *Step) []int32 {
		for i, x := range s.Steps {
			if x == st && i < len(o.GetSteps()) {
				return path(base, sagaSteps, int32(i), stepGroup)
			}
		}
		return path(base, sagaGroups, int32(g.index))
	}
	for _, st := range g.Steps {
		switch {
		case st.External:
			b.errorf(f, at(st), "group-execution", "run the external step before or after the group",
				"saga %s: external step %s is a member of group %s: a group dispatches its members' commands together, and an external step sends none", s.FullName, st.Name, g.Name)
		case st.Conditional:
			b.errorf(f, at(st), "group-execution", "make the step unconditional, or run it before or after the group",
				"saga %s: conditional step %s is a member of group %s: every member of a group runs", s.FullName, st.Name, g.Name)
		}
	}
	first := g.Steps[0].Role == sagav1.Role_ROLE_RETRIABLE
	for _, st := range g.Steps[1:] {
		if (st.Role == sagav1.Role_ROLE_RETRIABLE) != first {
			b.errorf(f, at(st), "group-execution", "split the group at the point of no return: retriable members in one group, the others in another",
				"saga %s: group %s has retriable members and members before the point of no return (%s is %s): a failing member would have to be compensated and retried at once", s.FullName, g.Name, st.Name, roleText(st.Role))
			return
		}
	}
}

func roleText(r sagav1.Role) string {
	switch r {
	case sagav1.Role_ROLE_RETRIABLE:
		return "retriable"
	case sagav1.Role_ROLE_COMPENSATABLE:
		return "compensatable"
	case sagav1.Role_ROLE_CHECK:
		return "a check"
	default:
		return r.String()
	}
}

// memberWait is how long a group member may wait for its reply: its timeout,
// times its attempts when its timeout resends the command.
func memberWait(st *Step) time.Duration {
	if st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_RETRY && st.MaxAttempts > 1 {
		return saturatingMul(st.Timeout, st.MaxAttempts)
	}
	return st.Timeout
}

func memberWaitText(st *Step) string {
	if st.OnTimeout == sagav1.TimeoutAction_TIMEOUT_ACTION_RETRY && st.MaxAttempts > 1 {
		return fmt.Sprintf("max_attempts %d × timeout %s", st.MaxAttempts, st.Timeout)
	}
	return "timeout " + st.Timeout.String()
}

func stepNames(steps []*Step) string {
	out := ""
	for i, st := range steps {
		if i > 0 {
			out += ", "
		}
		out += st.Name
	}
	return out
}
