package golang

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// shapeTypes holds the test message types of the definitions below, by
// full name.
var shapeTypes = sync.OnceValue(func() map[string]*message.Info {
	types := map[string]*message.Info{}
	add := func(name string, k message.Kind) { types[name] = sagatest.NewType(name, k) }
	add("s.v1.Start", message.KindCommand)
	for _, step := range []string{"A", "B", "C", "D", "E"} {
		add("s.v1."+step, message.KindCommand)
		add("s.v1."+step+"Done", message.KindReply)
		add("s.v1."+step+"Failed", message.KindReply)
		add("s.v1.Undo"+step, message.KindCommand)
		add("s.v1."+step+"Undone", message.KindReply)
		add("s.v1."+step+"UndoFailed", message.KindReply)
	}
	return types
})

// shapeStep returns step name with the given shape; a compensatable step
// declares a compensation failure reply when undoFails is set.
func shapeStep(name string, role sagadef.Role, external bool, onTimeout sagadef.TimeoutAction, attempts int, late sagadef.LatePolicy, undoFails bool) sagadef.Step {
	s := sagadef.Step{
		Name: name, Role: role, External: external,
		SuccessReplies: []string{"s.v1." + name + "Done"},
		Timeout:        time.Minute, OnTimeout: onTimeout, MaxAttempts: attempts, Late: late,
	}
	if !external {
		s.Command = "s.v1." + name
	}
	if role != sagadef.RoleRetriable {
		s.FailureReplies = []string{"s.v1." + name + "Failed"}
	}
	if role == sagadef.RoleCompensatable {
		s.Compensation, s.CompensationReply = "s.v1.Undo"+name, "s.v1."+name+"Undone"
		if undoFails {
			s.CompensationFailureReplies = []string{"s.v1." + name + "UndoFailed"}
		}
	}
	return s
}

// shapeDefinition returns a definition of steps, declaring the parallel
// groups they name (with a timeout longer than any member's wait).
func shapeDefinition(steps ...sagadef.Step) *sagadef.Definition {
	d := &sagadef.Definition{Name: "s.v1.Shape", StartMessage: "s.v1.Start", Steps: steps}
	for _, s := range steps {
		if s.Group != "" && !slices.ContainsFunc(d.Groups, func(g sagadef.Group) bool { return g.Name == s.Group }) {
			d.Groups = append(d.Groups, sagadef.Group{Name: s.Group, Timeout: time.Hour})
		}
	}
	return d
}

// grouped returns the steps as members of the named parallel group.
func grouped(group string, steps ...sagadef.Step) []sagadef.Step {
	for i := range steps {
		steps[i].Group = group
	}
	return steps
}

func shapeEnv() sagatest.ScenarioEnv {
	types := shapeTypes()
	var infos []*message.Info
	for _, info := range types {
		infos = append(infos, info)
	}
	return sagatest.ScenarioEnv{
		Hooks: sagatest.Hooks(infos...),
		Start: sagatest.NewMessage(types["s.v1.Start"], "k1"),
		New: func(name string) (message.Message, error) {
			info, ok := types[name]
			if !ok {
				return nil, fmt.Errorf("no test type %s", name)
			}
			return sagatest.NewMessage(info, "k1"), nil
		},
	}
}

// conditional returns s marked conditional.
func conditional(s sagadef.Step) sagadef.Step {
	s.Conditional = true
	return s
}

// shapes returns definitions covering every timeout action, attempt
// budget, late policy and step kind (compensatable with and without a
// compensation failure reply, pivot, retriable, check, External,
// conditional) at several positions.
func shapes() map[string]*sagadef.Definition {
	out := map[string]*sagadef.Definition{}
	actions := map[string]sagadef.TimeoutAction{"compensate": sagadef.TimeoutCompensate, "retry": sagadef.TimeoutRetry, "review": sagadef.TimeoutManualReview}
	policies := map[string]sagadef.LatePolicy{"ignore": sagadef.LateIgnore, "review": sagadef.LateManualReview, "apply": sagadef.LateApplyIfWaiting}
	for an, a := range actions {
		for pn, p := range policies {
			for _, attempts := range []int{1, 3} {
				for _, external := range []bool{false, true} {
					if external && a == sagadef.TimeoutRetry {
						continue // the design review refuses it; the machine treats it as a wait again
					}
					name := fmt.Sprintf("timeout=%s/late=%s/attempts=%d/external=%v", an, pn, attempts, external)
					out[name] = shapeDefinition(
						shapeStep("A", sagadef.RoleCompensatable, false, a, attempts, p, true),
						shapeStep("B", sagadef.RoleCompensatable, false, a, attempts, p, false),
						shapeStep("C", sagadef.RolePivot, external, a, attempts, p, false),
						shapeStep("D", sagadef.RoleRetriable, false, sagadef.TimeoutRetry, attempts, p, false),
					)
				}
			}
		}
	}
	// Check steps first and after a compensatable step, internal and
	// External; conditional compensatable, check and retriable steps.
	for an, a := range actions {
		for pn, p := range policies {
			for _, attempts := range []int{1, 3} {
				for _, external := range []bool{false, true} {
					if external && a == sagadef.TimeoutRetry {
						continue
					}
					c := shapeStep("C", sagadef.RoleCheck, external, a, attempts, p, false)
					c.Conditional = external
					name := fmt.Sprintf("check/timeout=%s/late=%s/attempts=%d/external=%v", an, pn, attempts, external)
					out[name] = shapeDefinition(
						shapeStep("A", sagadef.RoleCheck, false, a, attempts, p, false),
						conditional(shapeStep("B", sagadef.RoleCompensatable, false, a, attempts, p, attempts > 1)),
						c,
						shapeStep("D", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, p, false),
						conditional(shapeStep("E", sagadef.RoleRetriable, false, sagadef.TimeoutRetry, attempts, p, false)),
					)
				}
			}
		}
	}
	// A conditional first step, and two conditional compensatable steps
	// before a check.
	out["conditional-first"] = shapeDefinition(
		conditional(shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, true)),
		shapeStep("B", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false),
		conditional(shapeStep("C", sagadef.RoleRetriable, false, sagadef.TimeoutManualReview, 1, sagadef.LateIgnore, false)),
	)
	out["conditional-compensatables"] = shapeDefinition(
		shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false),
		conditional(shapeStep("B", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 2, sagadef.LateManualReview, true)),
		conditional(shapeStep("C", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 2, sagadef.LateApplyIfWaiting, false)),
		shapeStep("D", sagadef.RoleCheck, true, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, false),
		shapeStep("E", sagadef.RolePivot, false, sagadef.TimeoutManualReview, 1, sagadef.LateIgnore, false),
	)
	// Parallel groups: compensatable and check members before the pivot,
	// retriable members after it, with every timeout action, late policy
	// and budget.
	for an, a := range actions {
		for pn, p := range policies {
			for _, attempts := range []int{1, 3} {
				name := fmt.Sprintf("group/timeout=%s/late=%s/attempts=%d", an, pn, attempts)
				steps := []sagadef.Step{shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false)}
				steps = append(steps, grouped("Reserve",
					shapeStep("B", sagadef.RoleCompensatable, false, a, attempts, p, true),
					shapeStep("C", sagadef.RoleCheck, false, sagadef.TimeoutCompensate, 1, p, false),
					shapeStep("D", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 2, sagadef.LateManualReview, false))...)
				steps = append(steps, shapeStep("E", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false))
				out[name] = shapeDefinition(steps...)
			}
		}
	}
	retriableTimeout := sagadef.TimeoutManualReview
	out["group-after-pivot"] = shapeDefinition(append([]sagadef.Step{
		shapeStep("A", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, false)},
		grouped("Notify",
			shapeStep("B", sagadef.RoleRetriable, false, sagadef.TimeoutRetry, 3, sagadef.LateApplyIfWaiting, false),
			shapeStep("C", sagadef.RoleRetriable, false, retriableTimeout, 1, sagadef.LateIgnore, false))...)...)
	out["group-first"] = shapeDefinition(append(grouped("Reserve",
		shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, true),
		shapeStep("B", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 2, sagadef.LateApplyIfWaiting, false)),
		shapeStep("C", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false))...)
	// A retriable step that times out to review, and a pivot first.
	out["pivot-first"] = shapeDefinition(
		shapeStep("A", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 2, sagadef.LateManualReview, false),
		shapeStep("B", sagadef.RoleRetriable, false, sagadef.TimeoutManualReview, 1, sagadef.LateIgnore, false),
	)
	return out
}

// toHarness converts computed scenarios to the harness's type, as the
// emitter writes them.
func toHarness(scs []scenario) []sagatest.Scenario {
	kinds := map[moveKind]sagatest.MoveKind{
		moveStart: sagatest.MoveStart, moveReply: sagatest.MoveReply, moveEarlierReply: sagatest.MoveEarlierReply,
		moveTimeout: sagatest.MoveTimeout, moveDuplicate: sagatest.MoveDuplicate,
	}
	var out []sagatest.Scenario
	for _, sc := range scs {
		h := sagatest.Scenario{Name: sc.Name, Final: sc.Final, Compensated: sc.Compensated, Skipped: sc.Skipped}
		for _, m := range sc.Moves {
			k, ok := kinds[m.Do]
			if !ok {
				panic("no sagatest move kind " + string(m.Do))
			}
			h.Moves = append(h.Moves, sagatest.Move{Do: k, Step: m.Step, Message: m.Message, State: m.State, Class: m.Class, Sent: m.Sent})
		}
		out = append(out, h)
	}
	return out
}

// recorder is a testing.TB that records failures instead of reporting
// them; Fatal* ends the goroutine as testing's does.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// run runs sc on def with a recorder and returns the failures.
func run(def *sagadef.Definition, sc sagatest.Scenario) []string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sagatest.RunScenario(r, def, shapeEnv(), sc)
	}()
	<-done
	return r.failed
}

// TestScenariosHoldForEveryShape: the scenarios computed from the graph of
// every shape are what the state machine does.
func TestScenariosHoldForEveryShape(t *testing.T) {
	t.Parallel()
	for name, def := range shapes() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, def.Compile())
			scenarios := toHarness(graphScenarios(def.Steps))
			require.NotEmpty(t, scenarios)
			sagatest.RunScenarios(t, func() *sagadef.Definition { return shapeDefinition(def.Steps...) }, shapeEnv(), scenarios)
		})
	}
}

// requireMutantsFail requires each mutant of base to fail at least one
// of the scenarios computed from base.
func requireMutantsFail(t *testing.T, base func() *sagadef.Definition, scenarios []sagatest.Scenario, mutants map[string]func(d *sagadef.Definition)) {
	t.Helper()
	for name, mutate := range mutants {
		def := base()
		mutate(def)
		require.NoError(t, def.Compile(), name)
		var failed []string
		for _, sc := range scenarios {
			if f := run(def, sc); len(f) > 0 {
				failed = append(failed, sc.Name)
			}
		}
		require.NotEmpty(t, failed, "mutant %q: no scenario failed", name)
		t.Logf("mutant %q fails %s", name, strings.Join(failed, ", "))
	}
}

// TestScenariosCatchWrongCheckAndConditionalSteps: the scenarios of a
// saga with check and conditional steps fail on a definition that turns a
// check step compensatable or a compensatable step into a check, drops or
// moves a conditional flag, or makes a check step External.
func TestScenariosCatchWrongCheckAndConditionalSteps(t *testing.T) {
	t.Parallel()
	base := func() *sagadef.Definition {
		return shapeDefinition(
			conditional(shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 3, sagadef.LateManualReview, true)),
			shapeStep("B", sagadef.RoleCheck, false, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, false),
			shapeStep("C", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 3, sagadef.LateApplyIfWaiting, false),
			conditional(shapeStep("D", sagadef.RoleCheck, true, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false)),
			shapeStep("E", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, false),
		)
	}
	scenarios := toHarness(graphScenarios(base().Steps))
	for _, sc := range scenarios {
		require.Empty(t, run(base(), sc), "scenario %s on the definition it was computed from", sc.Name)
	}
	require.True(t, slices.ContainsFunc(scenarios, func(sc sagatest.Scenario) bool { return sc.Name == "E/failure/A-skipped" }),
		"a failure after the compensatable conditional step A is also run with A skipped")
	requireMutantsFail(t, base, scenarios, map[string]func(d *sagadef.Definition){
		"B is compensatable": func(d *sagadef.Definition) {
			d.Steps[1].Role, d.Steps[1].Compensation, d.Steps[1].CompensationReply = sagadef.RoleCompensatable, "s.v1.UndoB", "s.v1.BUndone"
		},
		"C is a check": func(d *sagadef.Definition) {
			d.Steps[2].Role, d.Steps[2].Compensation, d.Steps[2].CompensationReply = sagadef.RoleCheck, "", ""
		},
		"A is not conditional":    func(d *sagadef.Definition) { d.Steps[0].Conditional = false },
		"D is not conditional":    func(d *sagadef.Definition) { d.Steps[3].Conditional = false },
		"C is conditional, not A": func(d *sagadef.Definition) { d.Steps[0].Conditional, d.Steps[2].Conditional = false, true },
		"B is External":           func(d *sagadef.Definition) { d.Steps[1].External, d.Steps[1].Command = true, "" },
		"D sends a command": func(d *sagadef.Definition) {
			d.Steps[3].External, d.Steps[3].Command = false, "s.v1.D"
		},
	})
}

// TestScenariosCatchWrongDefinitions: each scenario set, computed from one
// definition, fails on a definition that differs from it in one property
// the graph gives (a timeout action, an attempt budget, a late policy, a
// role, a compensation failure reply, the order of steps), and on a harness
// that delivers the wrong replies.
func TestScenariosCatchWrongDefinitions(t *testing.T) {
	t.Parallel()
	base := func() *sagadef.Definition {
		return shapeDefinition(
			shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 3, sagadef.LateManualReview, true),
			shapeStep("B", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 3, sagadef.LateApplyIfWaiting, false),
			shapeStep("C", sagadef.RolePivot, true, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, false),
			shapeStep("D", sagadef.RoleRetriable, false, sagadef.TimeoutRetry, 3, sagadef.LateIgnore, false),
		)
	}
	scenarios := toHarness(graphScenarios(base().Steps))
	for _, sc := range scenarios {
		require.Empty(t, run(base(), sc), "scenario %s on the definition it was computed from", sc.Name)
	}
	mutants := map[string]func(d *sagadef.Definition){
		"A times out to review":         func(d *sagadef.Definition) { d.Steps[0].OnTimeout = sagadef.TimeoutManualReview },
		"B has 2 attempts":              func(d *sagadef.Definition) { d.Steps[1].MaxAttempts = 2 },
		"B ignores late replies":        func(d *sagadef.Definition) { d.Steps[1].Late = sagadef.LateIgnore },
		"A audits late replies":         func(d *sagadef.Definition) { d.Steps[0].Late = sagadef.LateIgnore },
		"D reviews late replies":        func(d *sagadef.Definition) { d.Steps[3].Late = sagadef.LateManualReview },
		"C times out to review":         func(d *sagadef.Definition) { d.Steps[2].OnTimeout = sagadef.TimeoutManualReview },
		"A has no compensation failure": func(d *sagadef.Definition) { d.Steps[0].CompensationFailureReplies = nil },
		"B is a check (no compensation)": func(d *sagadef.Definition) {
			d.Steps[1].Role, d.Steps[1].Compensation, d.Steps[1].CompensationReply = sagadef.RolePivot, "", ""
			d.Steps[2].Role = sagadef.RoleRetriable
			d.Steps[2].FailureReplies, d.Steps[2].OnTimeout = nil, sagadef.TimeoutManualReview
		},
		"A and B swapped": func(d *sagadef.Definition) { d.Steps[0], d.Steps[1] = d.Steps[1], d.Steps[0] },
	}
	requireMutantsFail(t, base, scenarios, mutants)

	// A harness that delivers the first failure reply whatever it is
	// asked for.
	broken := func(name string) (message.Message, error) {
		return sagatest.NewMessage(shapeTypes()["s.v1.AFailed"], "k1"), nil
	}
	var failed int
	for _, sc := range scenarios {
		r := &recorder{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			env := shapeEnv()
			env.New = broken
			sagatest.RunScenario(r, base(), env, sc)
		}()
		<-done
		if len(r.failed) > 0 {
			failed++
		}
	}
	require.Positive(t, failed, "a harness delivering the wrong replies fails no scenario")
}

// TestScenariosCatchWrongGroups: the scenarios of a saga with a parallel
// group cover every member × failure, timeout, late reply and duplicate,
// and fail on a definition that runs the members one after another, takes
// a member out of the group, reorders the members, or changes a member's
// role or timeout action.
func TestScenariosCatchWrongGroups(t *testing.T) {
	t.Parallel()
	base := func() *sagadef.Definition {
		steps := []sagadef.Step{shapeStep("A", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false)}
		steps = append(steps, grouped("Reserve",
			shapeStep("B", sagadef.RoleCompensatable, false, sagadef.TimeoutCompensate, 1, sagadef.LateManualReview, true),
			shapeStep("C", sagadef.RoleCheck, false, sagadef.TimeoutRetry, 3, sagadef.LateApplyIfWaiting, false),
			shapeStep("D", sagadef.RoleCompensatable, false, sagadef.TimeoutRetry, 2, sagadef.LateIgnore, false))...)
		steps = append(steps, shapeStep("E", sagadef.RolePivot, false, sagadef.TimeoutCompensate, 1, sagadef.LateIgnore, false))
		return shapeDefinition(steps...)
	}
	scenarios := toHarness(graphScenarios(base().Steps))
	for _, sc := range scenarios {
		require.Empty(t, run(base(), sc), "scenario %s on the definition it was computed from", sc.Name)
	}
	for _, member := range []string{"B", "C", "D"} {
		for _, kind := range []string{"failure", "timeout", "late-reply", "duplicate-reply"} {
			name := member + "/" + kind
			require.True(t, slices.ContainsFunc(scenarios, func(sc sagatest.Scenario) bool { return sc.Name == name }), "no scenario %s", name)
		}
	}
	// B fails while C and D wait: they stop; D, then B's earlier
	// neighbours are compensated in reverse contract order (C is a check).
	i := slices.IndexFunc(scenarios, func(sc sagatest.Scenario) bool { return sc.Name == "B/failure" })
	require.Equal(t, []string{"D", "A"}, scenarios[i].Compensated)
	requireMutantsFail(t, base, scenarios, map[string]func(d *sagadef.Definition){
		"no group": func(d *sagadef.Definition) {
			d.Groups = nil
			for i := range d.Steps {
				d.Steps[i].Group = ""
			}
		},
		"D is not a member": func(d *sagadef.Definition) { d.Steps[3].Group = "" },
		"C and D swapped":   func(d *sagadef.Definition) { d.Steps[2], d.Steps[3] = d.Steps[3], d.Steps[2] },
		"C is compensatable": func(d *sagadef.Definition) {
			d.Steps[2].Role, d.Steps[2].Compensation, d.Steps[2].CompensationReply = sagadef.RoleCompensatable, "s.v1.UndoC", "s.v1.CUndone"
		},
		"D compensates on timeout": func(d *sagadef.Definition) { d.Steps[3].OnTimeout = sagadef.TimeoutCompensate },
	})
}
