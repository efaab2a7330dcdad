package sagadef

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// groupSteps makes a random run of two or three consecutive steps that may
// share a group (no pivot, External or Conditional step; all retriable or
// none) a parallel group.
func groupSteps(r *rand.Rand, d *Definition) {
	fits := func(i int) bool {
		s := d.Steps[i]
		return s.Role != RolePivot && !s.External && !s.Conditional
	}
	var starts []int
	for i := 0; i+1 < len(d.Steps); i++ {
		if fits(i) && fits(i+1) && (d.Steps[i].Role == RoleRetriable) == (d.Steps[i+1].Role == RoleRetriable) {
			starts = append(starts, i)
		}
	}
	if len(starts) == 0 {
		return
	}
	first := starts[r.IntN(len(starts))]
	last := first + 1
	if last+1 < len(d.Steps) && fits(last+1) && (d.Steps[last+1].Role == RoleRetriable) == (d.Steps[first].Role == RoleRetriable) && r.IntN(2) == 0 {
		last++
	}
	d.Groups = []Group{{Name: "Together", Timeout: time.Hour}}
	for i := first; i <= last; i++ {
		d.Steps[i].Group = "Together"
	}
}

// randomDefinition returns a valid definition with 1–maxSteps steps and
// random roles, replies, timeouts, budgets and policies, with a parallel
// group when withGroups is set and the steps allow one.
func randomDefinition(r *rand.Rand, maxSteps int, withGroups bool) *Definition {
	n := 1 + r.IntN(maxSteps)
	d := &Definition{Name: "rand.Saga", StartMessage: "rand.Start"}
	if r.IntN(2) == 0 {
		d.Deadline = time.Hour
	}
	comps := r.IntN(n + 1)
	pivot := comps < n && r.IntN(3) > 0
	for i := range n {
		s := Step{
			Name:        fmt.Sprintf("Step%d", i),
			Timeout:     time.Minute,
			MaxAttempts: r.IntN(4),
			Late:        LatePolicy(1 + r.IntN(3)),
		}
		switch {
		case i < comps && r.IntN(3) == 0:
			s.Role = RoleCheck
		case i < comps:
			s.Role = RoleCompensatable
		case i == comps && pivot:
			s.Role = RolePivot
		default:
			s.Role = RoleRetriable
		}
		s.External = s.Role != RoleCompensatable && r.IntN(4) == 0
		s.Conditional = s.Role != RolePivot && r.IntN(4) == 0
		if !s.External {
			s.Command = fmt.Sprintf("rand.Cmd%d", i)
		}
		for k := range 1 + r.IntN(2) {
			s.SuccessReplies = append(s.SuccessReplies, fmt.Sprintf("rand.Ok%d_%d", i, k))
		}
		for k := range r.IntN(3) {
			s.FailureReplies = append(s.FailureReplies, fmt.Sprintf("rand.Fail%d_%d", i, k))
		}
		if s.Role == RoleCompensatable {
			s.Compensation = fmt.Sprintf("rand.Comp%d", i)
			s.CompensationReply = fmt.Sprintf("rand.CompOk%d", i)
			for k := range r.IntN(2) {
				s.CompensationFailureReplies = append(s.CompensationFailureReplies, fmt.Sprintf("rand.CompFail%d_%d", i, k))
			}
		}
		actions := []TimeoutAction{TimeoutManualReview}
		if s.Role != RoleRetriable {
			actions = append(actions, TimeoutCompensate)
		}
		if !s.External {
			actions = append(actions, TimeoutRetry)
		}
		s.OnTimeout = actions[r.IntN(len(actions))]
		d.Steps = append(d.Steps, s)
	}
	if !slices.ContainsFunc(d.Steps, func(s Step) bool { return !s.Conditional }) {
		d.Steps[0].Conditional = false
	}
	if withGroups {
		groupSteps(r, d)
	}
	if r.IntN(2) == 0 {
		d.Cancel = Cancel{Message: "rand.Cancel", RequestedBy: "by", Reason: "why"}
		if r.IntN(2) == 0 {
			// A child saga: without a pivot or retriable steps, a cancel
			// compensates it after it completed.
			d.Replies = Replies{Completed: "rand.ChildDone", Failed: "rand.ChildFailed", Cancelled: "rand.ChildCancelled"}
		}
	}
	return d
}

func describe(d *Definition) string {
	var b strings.Builder
	fmt.Fprintf(&b, "deadline=%s cancel=%q groups=%v child=%t\n", d.Deadline, d.Cancel.Message, d.Groups, d.CompensableAfterCompletion())
	for _, s := range d.Steps {
		fmt.Fprintf(&b, "  %s group=%q role=%s ext=%t cond=%t ok=%v fail=%v cf=%v timeout=%s max=%d late=%s\n", s.Name, s.Group, s.Role, s.External, s.Conditional,
			s.SuccessReplies, s.FailureReplies, s.CompensationFailureReplies, s.OnTimeout, s.MaxAttempts, s.Late)
	}
	return b.String()
}

func rowStrings(ts []Transition) map[string]bool {
	out := map[string]bool{}
	for _, t := range ts {
		out[fmt.Sprintf("%s --%s--> %s %v", t.From, t.Trigger, t.To, t.Emits)] = true
	}
	return out
}

// TestDeriveMatchesExploration checks the derived transition table against
// an exhaustive exploration of Apply, on many random definitions: every
// transition Apply can take is in the table, and every row of the table is
// taken by some reachable instance.
func TestDeriveMatchesExploration(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	n := 60
	if testing.Short() {
		n = 10
	}
	for i := range n {
		d := randomDefinition(r, 3+(i%4)/3, i%2 == 1) // every fourth has up to 4 steps; every second a group

		require.NoError(t, d.Compile(), describe(d))
		explored, err := d.explore()
		require.NoError(t, err)
		want, got := rowStrings(explored), rowStrings(d.Transitions)
		var missing, extra []string
		for k := range want {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		for k := range got {
			if !want[k] {
				extra = append(extra, k)
			}
		}
		if len(missing) > 0 || len(extra) > 0 {
			t.Fatalf("definition %d:\n%s\nmissing from table (Apply takes them):\n  %s\nextra in table (Apply never takes them):\n  %s",
				i, describe(d), strings.Join(missing, "\n  "), strings.Join(extra, "\n  "))
		}
	}
}
