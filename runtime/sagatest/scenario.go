package sagatest

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
)

// A Scenario is one path through a saga written out with what each move
// must lead to: protoc-gen-saga computes the scenarios of every saga from
// its step graph (each step × business failure, timeout, late reply and
// duplicate reply) and emits them as literals, so a reviewer reads the
// expectations and the harness checks that the state machine meets them.
type Scenario struct {
	// Name says what the scenario does ("ReserveInventory/timeout").
	Name string
	// Moves are applied in order; the first is a [MoveStart].
	Moves []Move
	// Final is the state the saga is in after the last move.
	Final string
	// Compensated lists the steps compensated by the end, in order.
	Compensated []string
	// Skipped lists the conditional steps the scenario skips, in the
	// order the saga reaches them; every other conditional step runs.
	// The runner decides so (see [RunScenario]), and the saga must have
	// recorded exactly these skips by the end (Progress.Skipped).
	Skipped []string
}

// MoveKind is what a [Move] does to the instance.
type MoveKind int

// Move kinds.
const (
	MoveUnspecified MoveKind = iota
	// MoveStart begins the instance from the start message.
	MoveStart
	// MoveReply answers the command the saga waits on (the event of an
	// External step) with Move.Message; with Move.Step set, the command
	// the saga waits on for that member of a parallel group.
	MoveReply
	// MoveEarlierReply answers the first command the saga sent for
	// Move.Step with Move.Message, after the saga stopped waiting for it
	// (a later attempt, a compensation, manual review).
	MoveEarlierReply
	// MoveTimeout moves the clock past the armed timeout and fires it.
	MoveTimeout
	// MoveDuplicate delivers the last message again with a new message id.
	MoveDuplicate
)

var moveNames = map[MoveKind]string{
	MoveStart: "start", MoveReply: "reply", MoveEarlierReply: "earlier reply",
	MoveTimeout: "timeout", MoveDuplicate: "duplicate",
}

func (k MoveKind) String() string {
	if n, ok := moveNames[k]; ok {
		return n
	}
	return fmt.Sprintf("MoveKind(%d)", int(k))
}

// A Move is one trigger of a scenario and what it must lead to.
type Move struct {
	Do MoveKind
	// Step is the step a MoveEarlierReply answers, and the group member
	// a MoveReply answers.
	Step string
	// Message is the full name of the reply or event delivered by
	// MoveReply and MoveEarlierReply.
	Message string
	// State is the state the instance must be in afterwards.
	State string
	// Class is how the machine must classify the trigger (not checked for
	// MoveStart).
	Class sagadef.Class
	// Sent lists the full names of the messages the move must send, in
	// order (none when empty).
	Sent []string
}

// ScenarioEnv is what [RunScenarios] drives a definition with.
type ScenarioEnv struct {
	// Hooks are the saga's hooks: the generated <Saga>Hooks of a decider,
	// or [StubHooks] to exercise the graph alone.
	Hooks sagadef.Hooks
	// Start is the start message each scenario begins with.
	Start message.Message
	// New returns an empty message of a full name, for the replies the
	// scenarios deliver; nil looks the type up in the protobuf registry
	// (generated messages register there when their package is linked).
	New func(fullName string) (message.Message, error)
}

// RunScenarios runs every scenario as a subtest on a fresh harness for
// def() (a new definition each, so subtests share nothing).
func RunScenarios(t *testing.T, def func() *sagadef.Definition, env ScenarioEnv, scenarios []Scenario) {
	t.Helper()
	if len(scenarios) == 0 {
		t.Fatalf("sagatest: no scenarios to run")
	}
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			RunScenario(t, def(), env, sc)
		})
	}
}

// RunScenario applies the moves of sc to a new harness for def and fails
// tb at the first move whose state, class or sent messages differ from
// the scenario's, or when the final state, compensated or skipped steps
// differ.
//
// The scenario decides its conditional steps: the runner wraps env.Hooks
// in a [sagadef.Skipper] that skips exactly the steps sc.Skipped lists.
// When env.Hooks implement Skipper themselves (a decider's generated
// hooks), they are asked first, so the decider's Skip<Step> runs on the
// saga data and an error from it fails the move; their answer is then
// replaced by the scenario's, which makes every path of the graph
// reachable whatever the start message.
func RunScenario(tb testing.TB, def *sagadef.Definition, env ScenarioEnv, sc Scenario) {
	tb.Helper()
	newMsg := env.New
	if newMsg == nil {
		newMsg = RegistryMessage
	}
	h := New(tb, def, scenarioHooks{Hooks: env.Hooks, scenario: sc.Name, skip: sc.Skipped})
	for i, mv := range sc.Moves {
		where := fmt.Sprintf("scenario %s, move %d (%s", sc.Name, i+1, mv.Do)
		if mv.Message != "" {
			where += " " + mv.Message
		}
		where += ")"
		if (i == 0) != (mv.Do == MoveStart) {
			tb.Fatalf("sagatest: %s: a scenario starts with one MoveStart", where)
		}
		var res sagadef.Result
		switch mv.Do {
		case MoveStart:
			res = h.Start(env.Start)
		case MoveReply, MoveEarlierReply:
			msg, err := newMsg(mv.Message)
			if err != nil {
				tb.Fatalf("sagatest: %s: %v", where, err)
			}
			switch {
			case mv.Do == MoveReply && mv.Step != "":
				res = h.ReplyFor(mv.Step, msg)
			case mv.Do == MoveReply:
				res = h.Reply(msg)
			default:
				res = h.ReplyTo(h.firstSent(mv.Step), msg)
			}
		case MoveTimeout:
			res = h.Timeout()
		case MoveDuplicate:
			res = h.Duplicate()
		default:
			tb.Fatalf("sagatest: %s: unknown move", where)
		}
		if got := h.Instance().State; got != mv.State {
			tb.Fatalf("sagatest: %s: state %s, want %s (note: %s)", where, got, mv.State, res.Note)
		}
		if mv.Do != MoveStart && res.Class != mv.Class {
			tb.Fatalf("sagatest: %s: classified %v, want %v (note: %s)", where, res.Class, mv.Class, res.Note)
		}
		var sent []string
		for _, o := range res.Emit {
			sent = append(sent, o.Message.SagaMessageInfo().FullName)
		}
		if len(sent) != 0 || len(mv.Sent) != 0 {
			if !reflect.DeepEqual(sent, mv.Sent) {
				tb.Fatalf("sagatest: %s: sent %v, want %v (note: %s)", where, sent, mv.Sent, res.Note)
			}
		}
	}
	if got := h.Instance().State; got != sc.Final {
		tb.Fatalf("sagatest: scenario %s: final state %s, want %s", sc.Name, got, sc.Final)
	}
	if got := h.Instance().Progress.Compensated; !reflect.DeepEqual(got, sc.Compensated) && (len(got) != 0 || len(sc.Compensated) != 0) {
		tb.Fatalf("sagatest: scenario %s: compensated %v, want %v", sc.Name, got, sc.Compensated)
	}
	if got := h.Instance().Progress.Skipped; !reflect.DeepEqual(got, sc.Skipped) && (len(got) != 0 || len(sc.Skipped) != 0) {
		tb.Fatalf("sagatest: scenario %s: skipped %v, want %v", sc.Name, got, sc.Skipped)
	}
}

// scenarioHooks are the hooks a scenario runs on: the environment's, with
// the conditional steps decided by the scenario.
type scenarioHooks struct {
	sagadef.Hooks
	scenario string
	skip     []string
}

// Skip asks the wrapped hooks' Skipper, when they have one, then answers
// as the scenario says: skipped exactly when the scenario lists the step.
func (h scenarioHooks) Skip(ctx context.Context, step string, data proto.Message) (bool, string, error) {
	if sk, ok := h.Hooks.(sagadef.Skipper); ok {
		if _, _, err := sk.Skip(ctx, step, data); err != nil {
			return false, "", fmt.Errorf("scenario %s: the hooks' Skip of step %s: %w", h.scenario, step, err)
		}
	}
	if slices.Contains(h.skip, step) {
		return true, "scenario " + h.scenario + " skips it", nil
	}
	return false, "", nil
}

// firstSent returns the id of the first command the saga sent for step, ""
// for a step it sent none for (an External step's event names no command).
func (h *Harness) firstSent(step string) string {
	sent := h.inst.Progress.Sent
	for _, o := range h.sent {
		if sent[o.MessageID] == step {
			return o.MessageID
		}
	}
	return ""
}

// RegistryMessage returns an empty message of the given full name from the
// protobuf registry: a generated contract message, registered when its Go
// package is linked.
func RegistryMessage(fullName string) (message.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(fullName))
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", fullName, err)
	}
	m, ok := mt.New().Interface().(message.Message)
	if !ok {
		return nil, fmt.Errorf("message %s: %T is not a saga contract message", fullName, mt.New().Interface())
	}
	return m, nil
}

// StubHooks returns hooks that exercise a definition's graph alone: Start
// returns an empty saga data message (def.DataMessage) and the business key
// "scenario", Build an empty command of the requested type, Apply folds
// nothing, and Skip (they implement [sagadef.Skipper]) skips no step. Messages come from the protobuf registry, so the contract
// package must be linked.
func StubHooks(def *sagadef.Definition) sagadef.Hooks {
	return stubHooks{data: def.DataMessage}
}

type stubHooks struct{ data string }

func (h stubHooks) Start(context.Context, message.Message) (proto.Message, string, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(h.data))
	if err != nil {
		return nil, "", fmt.Errorf("saga data %s: %w", h.data, err)
	}
	return mt.New().Interface(), "scenario", nil
}

func (h stubHooks) Build(_ context.Context, command string, _ proto.Message) (message.Message, error) {
	return RegistryMessage(command)
}

func (h stubHooks) Apply(context.Context, proto.Message, message.Message) error { return nil }

// Skip runs every conditional step.
func (h stubHooks) Skip(context.Context, string, proto.Message) (bool, string, error) {
	return false, "", nil
}
