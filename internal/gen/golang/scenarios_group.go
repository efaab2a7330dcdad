package golang

import (
	"slices"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Parallel groups in the scenario graph (see scenarios_graph.go).

// groupSpan returns the first and last member of the group step i belongs
// to; false when it runs alone.
func groupSpan(steps []sagadef.Step, i int) (first, last int, ok bool) {
	g := steps[i].Group
	if g == "" {
		return 0, 0, false
	}
	first, last = i, i
	for first > 0 && steps[first-1].Group == g {
		first--
	}
	for last+1 < len(steps) && steps[last+1].Group == g {
		last++
	}
	return first, last, true
}

// sameGroup reports whether steps i and j are members of one group.
func sameGroup(steps []sagadef.Step, i, j int) bool {
	return i < len(steps) && j < len(steps) && steps[i].Group != "" && steps[i].Group == steps[j].Group
}

// stateOf is the state in which the saga waits on step i: its group's
// state for a member.
func stateOf(steps []sagadef.Step, i int) string {
	if g := steps[i].Group; g != "" {
		return sagadef.StateName(g)
	}
	return sagadef.StateName(steps[i].Name)
}

// groupDone reports whether every member of step i's group completed.
func (w *walk) groupDone(i int) bool {
	first, last, _ := groupSpan(w.steps, i)
	for m := first; m <= last; m++ {
		if !slices.Contains(w.completed, w.steps[m].Name) {
			return false
		}
	}
	return true
}

// succeedAll answers step i, or every member of its group, with success.
func (w *walk) succeedAll(i int) {
	first, last, ok := groupSpan(w.steps, i)
	if !ok {
		w.succeed(i, sagadef.ClassNew)
		return
	}
	for m := first; m <= last; m++ {
		if !slices.Contains(w.completed, w.steps[m].Name) {
			w.succeed(m, sagadef.ClassNew)
		}
	}
}

// answerOthers answers, with success, the other members of step i's group
// (none for a step alone), so that step i is the one still waiting.
func (w *walk) answerOthers(i int) {
	first, last, ok := groupSpan(w.steps, i)
	if !ok {
		return
	}
	for m := first; m <= last; m++ {
		if m != i && !slices.Contains(w.completed, w.steps[m].Name) {
			w.succeed(m, sagadef.ClassNew)
		}
	}
}

// stopGroup records that the members of step i's group still waiting
// (other than i, which failed or stopped itself) stop: they are
// compensated with the completed ones.
func (w *walk) stopGroup(i int) {
	first, last, ok := groupSpan(w.steps, i)
	if !ok {
		return
	}
	for m := first; m <= last; m++ {
		name := w.steps[m].Name
		if m != i && !slices.Contains(w.completed, name) && !slices.Contains(w.stopped, name) {
			w.stopped = append(w.stopped, name)
		}
	}
}

// groupOrder puts the members of each group in ran (steps in the order
// they ran) in contract order where the group's first one ran: the
// runtime compensates a group's members in reverse contract order.
func groupOrder(steps []sagadef.Step, ran []string) []string {
	index := map[string]int{}
	for i, s := range steps {
		index[s.Name] = i
	}
	var out []string
	done := map[string]bool{}
	for _, name := range ran {
		i, ok := index[name]
		if !ok || steps[i].Group == "" {
			out = append(out, name)
			continue
		}
		if done[steps[i].Group] {
			continue
		}
		done[steps[i].Group] = true
		first, last, _ := groupSpan(steps, i)
		for m := first; m <= last; m++ {
			if slices.Contains(ran, steps[m].Name) {
				out = append(out, steps[m].Name)
			}
		}
	}
	return out
}
