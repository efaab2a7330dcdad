package sagadef

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// explore computes the transition table the slow, sure way: it explores the
// state machine by running Apply itself (dry: no hooks, no messages) from the
// initial instance, with every trigger that can reach an instance — every
// incoming message answering the pending command, an earlier attempt, or
// nothing the saga sent; the cancel message; timeouts; the deadline; every
// operator action — and records each result that is a transition. Instances
// are reduced to what Apply's decisions depend on (state, progress sets and
// outcomes, whether an earlier attempt of a command exists, whether the
// retry budget is fresh, partly spent or exhausted, whether timers are
// armed, whether a business cancel is recorded), which makes the explored
// space finite. The result holds exactly the transitions Apply can take;
// tests compare it with the derived table.

// exploreEpoch is the clock of the exploration; armed timers are set to it,
// so every armed timer is due.
var exploreEpoch = time.Unix(0, 0).UTC()

// maxExplored bounds the exploration; real definitions stay far below it.
const maxExplored = 200_000

func (d *Definition) explore() ([]Transition, error) {
	rows := rowSet{}
	err := d.walk(true, func(_ Instance, trig Trigger, res Result, names []string) {
		if trig.Kind == TriggerStart || isTransition(res.From, res.To, res.Class, len(names)) {
			rows.add(res.From, trig.Kind, res.To, names)
		}
	})
	if err != nil {
		return nil, err
	}
	return d.sortRows(rows), nil
}

// walk explores the state machine as explore describes and calls visit
// with every trigger it applies, the instance it applied it to (canonical,
// see canon; zero for the start) and the result (dry: no messages built,
// only their names). Without operators, the operator triggers are left
// out: walk then explores what the saga does on its own.
func (d *Definition) walk(operators bool, visit func(inst Instance, trig Trigger, res Result, names []string)) error {
	ctx := context.Background()
	env := Env{Now: exploreEpoch, NewID: newCounter("explore-")}
	m := mode{dry: true, assumeDue: true}

	// Every combination of the decider's skips of conditional steps.
	skips := []uint64{0}
	for i, s := range d.Steps {
		if s.Conditional {
			for _, k := range skips {
				skips = append(skips, k|1<<i)
			}
		}
	}
	seen := map[string]bool{}
	var queue []Instance
	for _, k := range skips {
		m.skips = k
		first, names, err := d.begin(ctx, env, "explore", nil, "explore", m)
		if err != nil {
			return err
		}
		visit(Instance{}, Trigger{Kind: TriggerStart}, first, names)
		start := d.canon(first.Instance)
		if key := stateKey(start); !seen[key] {
			seen[key] = true
			queue = append(queue, start)
		}
	}
	type probe struct {
		trig  Trigger
		skips uint64
		timer string
	}
	for len(queue) > 0 {
		inst := queue[0]
		queue = queue[1:]
		var all []probe
		// In a group state, a timeout is probed once per timer: the
		// group's and each waiting member's.
		timers := []string{""}
		if st := d.compiled.states[inst.State]; st.Kind == StateKindGroup && inst.Progress.Group != nil {
			timers = []string{st.Group}
			for _, mp := range inst.Progress.Group.Members {
				timers = append(timers, mp.Step)
			}
		}
		for _, trig := range d.probes(inst, operators) {
			for _, k := range skips {
				if trig.Kind != TriggerTimeout {
					all = append(all, probe{trig, k, ""})
					continue
				}
				for _, t := range timers {
					all = append(all, probe{trig, k, t})
				}
			}
		}
		for _, pr := range all {
			trig := pr.trig
			m.skips, m.timer = pr.skips, pr.timer
			res, names, err := d.apply(ctx, env, inst, trig, m)
			if err != nil {
				if errors.Is(err, ErrInvalidTrigger) || errors.Is(err, ErrTerminal) {
					continue // an operator action the state refuses
				}
				if errors.Is(err, ErrMisaddressed) && trig.CausationID == "explore-unknown" {
					continue // a reply naming no command sent for it: parked
				}
				return err
			}
			visit(inst, trig, res, names)
			if res.Instance.Version == inst.Version {
				continue // nothing changed
			}
			next := d.canon(res.Instance)
			if k := stateKey(next); !seen[k] {
				if len(seen) >= maxExplored {
					return fmt.Errorf("more than %d distinct instance shapes; the definition is too large to tabulate", maxExplored)
				}
				seen[k] = true
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// probes lists the triggers tried on an explored instance: each incoming
// message answering each command or compensation the instance sent for the
// message's step, or nothing it sent; the cancel message; a timeout; the
// deadline; and, with operators, every operator action.
func (d *Definition) probes(inst Instance, operators bool) []Trigger {
	var out []Trigger
	message := func(name, cause string) {
		out = append(out, Trigger{Kind: name, MessageID: "explore-message", CausationID: cause})
	}
	causes := func(sent map[string]string, step string) []string {
		list := []string{"explore-unknown"}
		for id, s := range sent {
			if s == step {
				list = append(list, id)
			}
		}
		slices.Sort(list)
		return list
	}
	for _, s := range d.Steps {
		replies := append(slices.Clone(s.SuccessReplies), s.FailureReplies...)
		stepCauses := []string{"explore-unknown"}
		if !s.External {
			stepCauses = causes(inst.Progress.Sent, s.Name)
		}
		for _, n := range replies {
			for _, c := range stepCauses {
				message(n, c)
			}
		}
		if s.Role != RoleCompensatable {
			continue
		}
		compCauses := causes(inst.Progress.SentCompensations, s.Name)
		for _, n := range append([]string{s.CompensationReply}, s.CompensationFailureReplies...) {
			for _, c := range compCauses {
				message(n, c)
			}
		}
	}
	if d.Cancel.Message != "" {
		message(d.Cancel.Message, "")
	}
	if IsTerminal(inst.State) {
		return out // timers are cleared and operators refused in terminal states
	}
	out = append(out, Trigger{Kind: TriggerTimeout}, Trigger{Kind: TriggerDeadline}, Trigger{Kind: TriggerStuck, Reason: "explore"})
	if !operators {
		return out
	}
	op := func(kind, to string) Trigger {
		return Trigger{Kind: kind, Operator: "explore", Reason: "explore", ResolveTo: to}
	}
	out = append(out, op(TriggerOperatorRetry, ""), op(TriggerOperatorCompensate, ""), op(TriggerOperatorCancel, ""))
	for _, to := range []string{StateCompleted, StateFailed, StateCancelled} {
		out = append(out, op(TriggerOperatorResolve, to))
	}
	return out
}

// canon reduces an instance to what Apply's decisions depend on, with
// message ids renamed so that equal shapes compare equal: the pending
// command is "p", earlier commands of a step "s:STEP", earlier compensations
// "c:STEP".
func (d *Definition) canon(inst Instance) Instance {
	st := d.compiled.states[inst.State]
	c := Instance{Type: inst.Type, State: inst.State}
	if st.Kind == StateKindStep || st.Kind == StateKindCompensating {
		max := d.Steps[d.compiled.steps[st.Step]].maxAttempts()
		// Attempts between the first and the last behave alike; the
		// last of them stands for all (its successor is the last attempt).
		switch a := inst.Attempt; {
		case a >= max:
			c.Attempt = max
		case a > 1:
			c.Attempt = max - 1
		default:
			c.Attempt = a
		}
	}
	// A command's id matters only as the pending one or not: the other
	// ids of one step (earlier attempts) behave alike. A settled step's
	// ids are kept: a reply that names none of them is misaddressed.
	// A group member's pending command is "p:STEP".
	memberPending := map[string]string{}
	if g := inst.Progress.Group; g != nil {
		for _, mp := range g.Members {
			memberPending[mp.Pending] = "p:" + mp.Step
		}
	}
	rename := func(m map[string]string, prefix string) map[string]string {
		if len(m) == 0 {
			return nil
		}
		out := make(map[string]string, len(m))
		for id, step := range m {
			switch {
			case id == inst.PendingMessageID:
				out["p"] = step
			case memberPending[id] != "":
				out[memberPending[id]] = step
			default:
				out[prefix+step] = step
			}
		}
		return out
	}
	if inst.PendingMessageID != "" {
		c.PendingMessageID = "p"
	}
	byStep := func(list []string) []string {
		out := slices.Clone(list)
		slices.SortFunc(out, func(a, b string) int { return cmp.Compare(d.compiled.steps[a], d.compiled.steps[b]) })
		return out
	}
	p := inst.Progress
	c.Progress = Progress{
		Completed:            slices.Clone(p.Completed),
		Compensated:          byStep(p.Compensated),
		Stopped:              byStep(p.Stopped),
		Skipped:              slices.Clone(p.Skipped),
		Outcomes:             cloneMap(p.Outcomes),
		CompensationOutcomes: cloneMap(p.CompensationOutcomes),
		Sent:                 rename(p.Sent, "s:"),
		SentCompensations:    rename(p.SentCompensations, "c:"),
		ReviewFrom:           p.ReviewFrom,
	}
	if p.Cancel != nil {
		c.Progress.Cancel = &Cancellation{}
	}
	if g := p.Group; g != nil {
		cg := &GroupProgress{Name: g.Name, TimeoutAt: exploreEpoch}
		for _, mp := range g.Members {
			max := d.Steps[d.compiled.steps[mp.Step]].maxAttempts()
			a := mp.Attempt
			switch {
			case a >= max:
				a = max
			case a > 1:
				a = max - 1
			}
			cg.Members = append(cg.Members, MemberProgress{Step: mp.Step, Pending: "p:" + mp.Step, Attempt: a, TimeoutAt: exploreEpoch})
		}
		c.Progress.Group = cg
	}
	if !inst.TimeoutAt.IsZero() {
		c.TimeoutAt = exploreEpoch
	}
	if !inst.DeadlineAt.IsZero() {
		c.DeadlineAt = exploreEpoch
	}
	return c
}

// stateKey identifies a canonical instance.
func stateKey(inst Instance) string {
	var b strings.Builder
	b.WriteString(inst.State)
	fmt.Fprintf(&b, "|%s|%d|%t|%t", inst.PendingMessageID, inst.Attempt, !inst.TimeoutAt.IsZero(), !inst.DeadlineAt.IsZero())
	p := inst.Progress
	for _, list := range [][]string{p.Completed, p.Compensated, p.Stopped, p.Skipped} {
		b.WriteByte('|')
		b.WriteString(strings.Join(list, ","))
	}
	for _, m := range []map[string]string{p.Outcomes, p.CompensationOutcomes, p.Sent, p.SentCompensations} {
		b.WriteByte('|')
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b.WriteString(k)
			b.WriteByte('=')
			b.WriteString(m[k])
			b.WriteByte(',')
		}
	}
	b.WriteByte('|')
	b.WriteString(p.ReviewFrom)
	fmt.Fprintf(&b, "|%t", p.Cancel != nil)
	if g := p.Group; g != nil {
		fmt.Fprintf(&b, "|%s", g.Name)
		for _, mp := range g.Members {
			fmt.Fprintf(&b, ",%s/%s/%d", mp.Step, mp.Pending, mp.Attempt)
		}
	}
	return b.String()
}
