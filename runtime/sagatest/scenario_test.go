package sagatest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

func scenarioEnv() sagatest.ScenarioEnv {
	types := map[string]*message.Info{tStart.FullName: tStart, tDo.FullName: tDo, tDone.FullName: tDone, tFailed.FullName: tFailed}
	return sagatest.ScenarioEnv{
		Hooks: sagatest.Hooks(tStart, tDo, tDone, tFailed),
		Start: sagatest.NewMessage(tStart, "k1"),
		New: func(name string) (message.Message, error) {
			info, ok := types[name]
			if !ok {
				return nil, fmt.Errorf("no test type %s", name)
			}
			return sagatest.NewMessage(info, "k1"), nil
		},
	}
}

// lateScenario: the answer to attempt 1 while attempt 2 waits is audited
// (LateIgnore), the awaited answer completes, its duplicate changes nothing.
func lateScenario() sagatest.Scenario {
	return sagatest.Scenario{
		Name: "late",
		Moves: []sagatest.Move{
			{Do: sagatest.MoveStart, State: "DO", Sent: []string{tDo.FullName}},
			{Do: sagatest.MoveTimeout, State: "DO", Class: sagadef.ClassNew, Sent: []string{tDo.FullName}},
			{Do: sagatest.MoveEarlierReply, Step: "Do", Message: tDone.FullName, State: "DO", Class: sagadef.ClassLate},
			{Do: sagatest.MoveReply, Message: tDone.FullName, State: sagadef.StateCompleted, Class: sagadef.ClassNew},
			{Do: sagatest.MoveDuplicate, State: sagadef.StateCompleted, Class: sagadef.ClassDuplicate},
		},
		Final: sagadef.StateCompleted,
	}
}

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

func runRecorded(sc sagatest.Scenario) []string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sagatest.RunScenario(r, definition(), scenarioEnv(), sc)
	}()
	<-done
	return r.failed
}

func TestRunScenarios(t *testing.T) {
	t.Parallel()
	sagatest.RunScenarios(t, definition, scenarioEnv(), []sagatest.Scenario{lateScenario()})
}

// TestRunScenarioFailsOnWrongExpectations: every expectation a scenario
// writes out is checked.
func TestRunScenarioFailsOnWrongExpectations(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		edit func(sc *sagatest.Scenario)
		want string
	}{
		"state":       {func(sc *sagatest.Scenario) { sc.Moves[1].State = sagadef.StateManualReview }, "state DO, want MANUAL_REVIEW"},
		"class":       {func(sc *sagatest.Scenario) { sc.Moves[2].Class = sagadef.ClassNew }, "classified late, want new"},
		"sent":        {func(sc *sagatest.Scenario) { sc.Moves[1].Sent = nil }, "sent [t.v1.Do], want []"},
		"final":       {func(sc *sagatest.Scenario) { sc.Final = sagadef.StateFailed }, "final state COMPLETED, want FAILED"},
		"compensated": {func(sc *sagatest.Scenario) { sc.Compensated = []string{"Do"} }, "compensated [], want [Do]"},
		"no start":    {func(sc *sagatest.Scenario) { sc.Moves = sc.Moves[1:] }, "a scenario starts with one MoveStart"},
		"message":     {func(sc *sagatest.Scenario) { sc.Moves[3].Message = "t.v1.Unknown" }, "no test type t.v1.Unknown"},
	}
	require.Empty(t, runRecorded(lateScenario()))
	for name, c := range cases {
		sc := lateScenario()
		c.edit(&sc)
		failed := runRecorded(sc)
		require.NotEmpty(t, failed, name)
		require.True(t, strings.Contains(strings.Join(failed, "\n"), c.want), "%s: %v", name, failed)
	}
}

func TestRegistryMessage(t *testing.T) {
	t.Parallel()
	_, err := sagatest.RegistryMessage("t.v1.NotRegistered")
	require.ErrorContains(t, err, "message t.v1.NotRegistered")
	_, err = sagatest.RegistryMessage("google.protobuf.Struct")
	require.ErrorContains(t, err, "is not a saga contract message")
}

var (
	tMaybe     = sagatest.NewType("t.v1.Maybe", message.KindCommand)
	tMaybeDone = sagatest.NewType("t.v1.MaybeDone", message.KindReply)
)

// conditionalDefinition is definition with a conditional step Maybe
// before Do.
func conditionalDefinition() *sagadef.Definition {
	d := definition()
	maybe := d.Steps[0]
	maybe.Name, maybe.Command, maybe.SuccessReplies, maybe.FailureReplies, maybe.Conditional = "Maybe", tMaybe.FullName, []string{tMaybeDone.FullName}, nil, true
	d.Steps = append([]sagadef.Step{maybe}, d.Steps...)
	return d
}

// conditionalScenario: with skip, Maybe is skipped and the saga waits on
// Do at once; without, Maybe runs first.
func conditionalScenario(skip bool) sagatest.Scenario {
	if skip {
		return sagatest.Scenario{
			Name: "maybe-skipped",
			Moves: []sagatest.Move{
				{Do: sagatest.MoveStart, State: "DO", Sent: []string{tDo.FullName}},
				{Do: sagatest.MoveReply, Message: tDone.FullName, State: sagadef.StateCompleted, Class: sagadef.ClassNew},
			},
			Final:   sagadef.StateCompleted,
			Skipped: []string{"Maybe"},
		}
	}
	return sagatest.Scenario{
		Name: "maybe-runs",
		Moves: []sagatest.Move{
			{Do: sagatest.MoveStart, State: "MAYBE", Sent: []string{tMaybe.FullName}},
			{Do: sagatest.MoveReply, Message: tMaybeDone.FullName, State: "DO", Class: sagadef.ClassNew, Sent: []string{tDo.FullName}},
			{Do: sagatest.MoveReply, Message: tDone.FullName, State: sagadef.StateCompleted, Class: sagadef.ClassNew},
		},
		Final: sagadef.StateCompleted,
	}
}

// TestRunScenarioDecidesConditionalSteps: the scenario decides which
// conditional steps are skipped, whatever the hooks' Skipper answers; the
// hooks' Skipper is still called and its error fails the scenario; a skip
// the saga did not record fails it.
func TestRunScenarioDecidesConditionalSteps(t *testing.T) {
	t.Parallel()
	env := scenarioEnv()
	env.Hooks = sagatest.Hooks(tStart, tDo, tDone, tFailed, tMaybe, tMaybeDone)
	types := map[string]*message.Info{tDone.FullName: tDone, tMaybeDone.FullName: tMaybeDone}
	env.New = func(name string) (message.Message, error) {
		info, ok := types[name]
		if !ok {
			return nil, fmt.Errorf("no test type %s", name)
		}
		return sagatest.NewMessage(info, "k1"), nil
	}
	run := func(hooks sagadef.Hooks, def *sagadef.Definition, sc sagatest.Scenario) []string {
		e := env
		e.Hooks = hooks
		r := &recorder{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			sagatest.RunScenario(r, def, e, sc)
		}()
		<-done
		return r.failed
	}
	var asked []string
	var mu sync.Mutex
	alwaysSkip := sagatest.Skipping(env.Hooks, func(step string, _ proto.Message) (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, step)
		return true, "the decider skips every step"
	})
	for _, skip := range []bool{false, true} {
		sc := conditionalScenario(skip)
		require.Empty(t, run(env.Hooks, conditionalDefinition(), sc), "%s on hooks that skip nothing", sc.Name)
		require.Empty(t, run(alwaysSkip, conditionalDefinition(), sc), "%s on hooks that skip every step", sc.Name)
	}
	require.Equal(t, []string{"Maybe", "Maybe"}, asked, "the hooks' Skipper is asked once per start")

	failing := failingSkipper{env.Hooks}
	failed := run(failing, conditionalDefinition(), conditionalScenario(true))
	require.NotEmpty(t, failed)
	require.Contains(t, strings.Join(failed, "\n"), "the hooks' Skip of step Maybe: no decision for k1")

	// The same scenarios on a definition where Maybe is not conditional.
	plain := conditionalDefinition()
	plain.Steps[0].Conditional = false
	failed = run(env.Hooks, plain, conditionalScenario(true))
	require.NotEmpty(t, failed, "a skip of a step that is not conditional")
	require.Contains(t, strings.Join(failed, "\n"), "state MAYBE, want DO")
	require.Empty(t, run(env.Hooks, plain, conditionalScenario(false)))
	sc := conditionalScenario(false)
	sc.Skipped = []string{"Do"}
	failed = run(env.Hooks, conditionalDefinition(), sc)
	require.Contains(t, strings.Join(failed, "\n"), "skipped [], want [Do]")
}

// failingSkipper is hooks whose Skip fails.
type failingSkipper struct{ sagadef.Hooks }

func (failingSkipper) Skip(context.Context, string, proto.Message) (bool, string, error) {
	return false, "", errors.New("no decision for k1")
}
