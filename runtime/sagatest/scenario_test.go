package sagatest_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

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
