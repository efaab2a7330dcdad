package sagadef

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The late-reply tables of docs/options.md are derived here from Apply
// itself: for every shape a step can have (role, on_timeout, external) and
// every late-reply policy, a saga built around such a step is explored
// exhaustively (walk), and every message for the step (or its
// compensation) that Apply classifies late is recorded with the situation
// it met and what Apply did with it. The situation and the action are read
// off the instance and the result, not from Apply's own reasoning: an
// answer is "applied" when Apply did exactly what it does with the answer
// it waits for.

// lateShape is a step's shape as far as late messages go.
type lateShape struct {
	role      Role
	onTimeout TimeoutAction
	external  bool
}

// lateShapes lists every shape a valid step can have.
func lateShapes() []lateShape {
	var out []lateShape
	for _, role := range []Role{RoleCompensatable, RolePivot, RoleRetriable} {
		for _, external := range []bool{false, true} {
			for _, a := range []TimeoutAction{TimeoutCompensate, TimeoutRetry, TimeoutManualReview} {
				if (role == RoleRetriable && a == TimeoutCompensate) || (external && a == TimeoutRetry) {
					continue // Compile refuses them
				}
				out = append(out, lateShape{role: role, onTimeout: a, external: external})
			}
		}
	}
	return out
}

var lateTimeoutNames = map[TimeoutAction]string{
	TimeoutCompensate: "COMPENSATE", TimeoutRetry: "RETRY", TimeoutManualReview: "MANUAL_REVIEW",
}

func (s lateShape) String() string {
	ext := ""
	if s.external {
		ext = " external"
	}
	return fmt.Sprintf("%s%s, `%s`", s.role, ext, lateTimeoutNames[s.onTimeout])
}

// lateTarget is the name of the step whose late messages are tabulated.
const lateTarget = "Target"

// lateDefinition returns a saga around a step of shape sh with policy p: a
// compensatable step before it (and a pivot, for a retriable one), a
// deadline and a business cancel, and a budget of two sends for the step
// and its compensation, so that every situation a late message can meet
// is reachable.
func lateDefinition(sh lateShape, p LatePolicy) *Definition {
	d := &Definition{
		Name: "late.Saga", StartMessage: "late.Start", Deadline: time.Hour,
		Cancel: Cancel{Message: "late.Cancel"},
		Steps: []Step{{
			Name: "Before", Role: RoleCompensatable, Command: "late.Before", SuccessReplies: []string{"late.BeforeDone"},
			Compensation: "late.UndoBefore", CompensationReply: "late.BeforeUndone",
			Timeout: time.Minute, OnTimeout: TimeoutCompensate, Late: LateIgnore,
		}},
	}
	if sh.role == RoleRetriable {
		d.Steps = append(d.Steps, Step{
			Name: "Pivot", Role: RolePivot, Command: "late.Pivot", SuccessReplies: []string{"late.PivotDone"},
			Timeout: time.Minute, OnTimeout: TimeoutCompensate, Late: LateIgnore,
		})
	}
	s := Step{
		Name: lateTarget, Role: sh.role, External: sh.external,
		SuccessReplies: []string{"late.TargetDone"}, FailureReplies: []string{"late.TargetFailed"},
		Timeout: time.Minute, OnTimeout: sh.onTimeout, MaxAttempts: 2, Late: p,
	}
	if !sh.external {
		s.Command = "late.Target"
	}
	if sh.role == RoleCompensatable {
		s.Compensation, s.CompensationReply = "late.UndoTarget", "late.TargetUndone"
		s.CompensationFailureReplies = []string{"late.TargetUndoFailed"}
	}
	d.Steps = append(d.Steps, s)
	return d
}

// lateKey is one cell of the late-reply table.
type lateKey struct {
	msg  lateMessage
	when lateWhen
}

// lateObservations explores d (compiled, built by lateDefinition) and
// returns, for every late message of the target step and the situation it
// met, what Apply did with it; with operators, the operator actions are
// explored too. It also returns the transition table the exploration
// took, and an error for a late message it cannot place.
func (d *Definition) lateObservations(operators bool) (map[lateKey]map[lateAction]bool, []Transition, error) {
	target := d.compiled.steps[lateTarget]
	s := &d.Steps[target]
	obs := map[lateKey]map[lateAction]bool{}
	rows := rowSet{}
	var problems []string
	err := d.walk(operators, func(inst Instance, trig Trigger, res Result, names []string) {
		if trig.Kind == TriggerStart || isTransition(res.From, res.To, res.Class, len(names)) {
			rows.add(res.From, trig.Kind, res.To, names)
		}
		ref, ok := d.compiled.messages[trig.Kind]
		if !ok || ref.step != target || res.Class != ClassLate {
			return
		}
		var m lateMessage
		switch ref.use {
		case UseSuccess:
			m = lateSuccessReply
			if s.External {
				m = lateSuccessEvent
			}
		case UseFailure:
			m = lateFailureReply
			if s.External {
				m = lateFailureEvent
			}
		case UseCompensationReply:
			m = lateCompensated
		case UseCompensationFailure:
			m = lateCompensationFailed
		}
		when := d.observedSituation(inst, m)
		a := d.observedAction(inst, trig, res, names, when)
		if when == 0 || a == 0 {
			problems = append(problems, fmt.Sprintf("%s in %s (%+v): situation %d, action %d: %s -> %s %s",
				trig.Kind, inst.State, inst.Progress, when, a, res.From, res.To, res.Instance.ReviewReason))
			return
		}
		k := lateKey{m, when}
		if obs[k] == nil {
			obs[k] = map[lateAction]bool{}
		}
		obs[k][a] = true
	})
	if err == nil && len(problems) > 0 {
		err = fmt.Errorf("late messages the table cannot place:\n  %s", strings.Join(problems, "\n  "))
	}
	return obs, d.sortRows(rows), err
}

// observedSituation says where inst is for late message m of the target
// step, from the instance alone.
func (d *Definition) observedSituation(inst Instance, m lateMessage) lateWhen {
	own := StateName(lateTarget)
	if m.compensation() {
		own = CompensatingStateName(lateTarget)
	}
	st := d.compiled.states[inst.State]
	switch {
	case inst.State == own:
		return lateWaiting
	case st.Kind == StateKindManualReview:
		return lateInReview
	case st.Kind == StateKindCompensating, inst.State == StateFailed, inst.State == StateCancelled:
		return lateUndone
	case inst.State == StateCompleted:
		return lateDone
	}
	return 0
}

// observedAction says what Apply did with a late message, from the result:
// nothing (audited); exactly what the answer the saga waits for does
// (applied); recorded it in review; or sent the saga to review.
func (d *Definition) observedAction(inst Instance, trig Trigger, res Result, names []string, when lateWhen) lateAction {
	if res.Instance.Version == inst.Version {
		return lateAudit
	}
	if when == lateWaiting {
		onTime := inst
		onTime.PendingMessageID = trig.CausationID
		env := Env{Now: exploreEpoch, NewID: newCounter("on-time-")}
		want, wantNames, err := d.apply(context.Background(), env, onTime, trig, mode{dry: true, assumeDue: true})
		if err == nil && want.Class == ClassNew && want.To == res.To && slices.Equal(wantNames, names) &&
			want.Instance.ReviewReason == res.Instance.ReviewReason && want.Instance.LastError == res.Instance.LastError {
			return lateApply
		}
	}
	if len(names) > 0 || res.To != StateManualReview {
		return 0
	}
	if inst.State == StateManualReview {
		return lateRecord
	}
	return lateReview
}

// lateTables is what the exploration of every shape and policy found.
type lateTables struct {
	// cells holds, per table cell, the action under each policy.
	cells map[lateKey]map[LatePolicy]lateAction
	// alone holds, per shape, the cells a saga meets without an operator.
	alone map[lateShape]map[lateKey]bool
}

var latePolicies = []LatePolicy{LateIgnore, LateManualReview, LateApplyIfWaiting}

// deriveLateTables explores every shape under every policy (with operator
// actions), and every shape under LateIgnore without them. It fails when
// Apply does two things with one cell, or something lateRule does not say,
// or takes a transition the derived table lacks (or has one it never takes).
func deriveLateTables(t *testing.T) lateTables {
	t.Helper()
	lt := lateTables{cells: map[lateKey]map[LatePolicy]lateAction{}, alone: map[lateShape]map[lateKey]bool{}}
	for _, sh := range lateShapes() {
		for _, p := range latePolicies {
			d := lateDefinition(sh, p)
			require.NoError(t, d.Compile(), "%s, %s", sh, p)
			obs, explored, err := d.lateObservations(true)
			require.NoError(t, err, "%s, %s", sh, p)
			require.Equal(t, rowStrings(explored), rowStrings(d.Transitions), "%s, %s: the derived transition table differs from the explored one", sh, p)
			for k, acts := range obs {
				require.Len(t, acts, 1, "%s, %s: %+v: Apply does more than one thing", sh, p, k)
				for a := range acts {
					require.Equal(t, lateRule(k.msg, k.when, p), a, "%s, %s: %+v: Apply does not do what lateRule says", sh, p, k)
					if lt.cells[k] == nil {
						lt.cells[k] = map[LatePolicy]lateAction{}
					}
					lt.cells[k][p] = a
				}
			}
		}
		d := lateDefinition(sh, LateIgnore)
		require.NoError(t, d.Compile())
		obs, _, err := d.lateObservations(false)
		require.NoError(t, err, "%s without operators", sh)
		lt.alone[sh] = map[lateKey]bool{}
		for k := range obs {
			lt.alone[sh][k] = true
		}
	}
	return lt
}

// TestLateReplyTable derives the late-reply tables from Apply and checks
// them: every cell that can arise is reached (and no other), the step's
// role and on_timeout never change what a late message does (lateRule does
// not take them, and Apply does what lateRule says for every shape), and
// Step.LatePolicyInert, which the design review reports, holds exactly for
// the shapes whose policy changes nothing without an operator. The printed
// tables in docs/options.md are compared by TestLateReplyTableInDocs.
func TestLateReplyTable(t *testing.T) {
	t.Parallel()
	lt := deriveLateTables(t)
	var want, got []lateKey
	for _, m := range lateMessages {
		for _, w := range lateSituations {
			event := m == lateSuccessEvent || m == lateFailureEvent
			if event && w == lateWaiting {
				continue // an event has no attempts
			}
			want = append(want, lateKey{m, w})
			if lt.cells[lateKey{m, w}] != nil {
				got = append(got, lateKey{m, w})
			}
		}
	}
	require.Equal(t, want, got, "the cells the exploration reached")
	for k, byPolicy := range lt.cells {
		require.Len(t, byPolicy, len(latePolicies), "%+v", k)
		if k.when != lateWaiting {
			require.Equal(t, byPolicy[LateIgnore], byPolicy[LateApplyIfWaiting],
				"%+v: apply if waiting differs from ignore only while the step waits", k)
		}
	}
	for sh, cells := range lt.alone {
		waits := cells[lateKey{lateSuccessReply, lateWaiting}] || cells[lateKey{lateFailureReply, lateWaiting}]
		step := Step{Role: sh.role, OnTimeout: sh.onTimeout, External: sh.external, Late: LateApplyIfWaiting}
		require.Equal(t, !waits, step.LatePolicyInert(), "%s: an earlier attempt's answer reaches the step without an operator: %t", sh, waits)
		for _, p := range []LatePolicy{LateIgnore, LateManualReview} {
			step.Late = p
			require.False(t, step.LatePolicyInert(), "%s: %s", sh, p)
		}
	}
}

// Labels of the printed tables.
var (
	lateMessageLabels = map[lateMessage]string{
		lateSuccessReply: "success reply", lateFailureReply: "failure reply",
		lateSuccessEvent: "success event (external step)", lateFailureEvent: "failure event (external step)",
		lateCompensated: "compensation reply", lateCompensationFailed: "compensation failure reply",
	}
	// lateSituationLabels names the situations; %s is "step" or
	// "compensation".
	lateSituationLabels = map[lateWhen]string{
		lateWaiting:  "the %s still waits, for a later attempt: the message answers an earlier one",
		lateInReview: "the saga is in manual review",
		lateUndone:   "the %s stopped waiting; the saga compensates, or ended `FAILED` or `CANCELLED`",
		lateDone:     "the %s stopped waiting; the saga ended `COMPLETED`",
	}
	lateShortSituations = map[lateWhen]string{
		lateWaiting: "earlier attempt", lateInReview: "in review",
		lateUndone: "after it stopped", lateDone: "after `COMPLETED`",
	}
	lateActionLabels = map[lateAction]string{
		lateAudit: "audited", lateRecord: "recorded", lateApply: "applied", lateReview: "**manual review**",
	}
	latePolicyNames = map[LatePolicy]string{
		LateIgnore: "LATE_REPLY_IGNORE", LateManualReview: "LATE_REPLY_MANUAL_REVIEW", LateApplyIfWaiting: "LATE_REPLY_APPLY_IF_WAITING",
	}
)

// markdown prints the two tables of docs/options.md: what a late message
// does, and which late messages a step of each shape meets without an
// operator.
func (lt lateTables) markdown() string {
	var b strings.Builder
	b.WriteString("What a late message does, by the step's `late_reply`:\n\n| late message | when it arrives | ")
	for i, p := range latePolicies {
		if i > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "`%s`", latePolicyNames[p])
	}
	b.WriteString(" |\n|---|---|---|---|---|\n")
	for _, m := range lateMessages {
		for _, w := range lateSituations {
			cells := lt.cells[lateKey{m, w}]
			if cells == nil {
				continue
			}
			subject := "step"
			if m.compensation() {
				subject = "compensation"
			}
			when := lateSituationLabels[w]
			if strings.Contains(when, "%s") {
				when = fmt.Sprintf(when, subject)
			}
			fmt.Fprintf(&b, "| %s | %s |", lateMessageLabels[m], when)
			for _, p := range latePolicies {
				fmt.Fprintf(&b, " %s |", lateActionLabels[cells[p]])
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString("\nWhere a step meets each late message without an operator's action:\n" +
		"\n| step (role, on_timeout) | success reply or event | failure reply or event | compensation reply | compensation failure reply |\n|---|---|---|---|---|\n")
	for _, sh := range lateShapes() {
		cells := lt.alone[sh]
		fmt.Fprintf(&b, "| %s |", sh)
		for _, col := range [][]lateMessage{
			{lateSuccessReply, lateSuccessEvent}, {lateFailureReply, lateFailureEvent},
			{lateCompensated}, {lateCompensationFailed},
		} {
			var whens []string
			for _, w := range lateSituations {
				for _, m := range col {
					if cells[lateKey{m, w}] {
						whens = append(whens, lateShortSituations[w])
						break
					}
				}
			}
			cell := strings.Join(whens, ", ")
			if cell == "" {
				cell = "—"
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
