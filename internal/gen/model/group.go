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
// has, names at least two consecutive steps, none of them the pivot, and
// waits at least as long as each member may (rules group-reference,
// group-members, group-timeout). The engine runs steps one at a time, so a
// contract that declares a group is refused (rule group-execution) rather
// than run with its members in sequence.
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
			b.errorf(f, p, "group-reference", fmt.Sprintf("declare it in the saga's groups: {name: %q, timeout: \"5m\"}", name),
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
		b.errorf(f, p, "group-execution", "run the members as consecutive steps: remove group from them and the saga's groups",
			"saga %s: group %s: the saga runtime dispatches one step at a time and does not run parallel groups, so this contract cannot be generated", s.FullName, g.Name)
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
