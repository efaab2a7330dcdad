package sagadef_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

func TestStateName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ReserveInventory":  "RESERVE_INVENTORY",
		"HTTPCall":          "HTTP_CALL",
		"CallHTTP":          "CALL_HTTP",
		"ApproveV2":         "APPROVE_V2",
		"Step2Go":           "STEP2_GO",
		"reserve_inventory": "RESERVE_INVENTORY",
		"Reserve_Inventory": "RESERVE_INVENTORY",
		"A":                 "A",
		"SendSMSToUser":     "SEND_SMS_TO_USER",
	} {
		require.Equal(t, want, sagadef.StateName(in), in)
	}
	require.Equal(t, "COMPENSATING_RESERVE_INVENTORY", sagadef.CompensatingStateName("ReserveInventory"))
	require.True(t, sagadef.IsTerminal(sagadef.StateCancelled))
	require.False(t, sagadef.IsTerminal(sagadef.StateManualReview))
}

func TestCompile(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder())
	var names []string
	for _, s := range d.States {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{sReserve, sAuthorize, sShipping, sApprove, sCompReserve,
		sagadef.StateManualReview, sagadef.StateCompleted, sagadef.StateFailed, sagadef.StateCancelled}, names)
	st, ok := d.LookupState(sCompReserve)
	require.True(t, ok)
	require.Equal(t, sagadef.State{Name: sCompReserve, Kind: sagadef.StateKindCompensating, Step: "ReserveInventory"}, st)

	ref, ok := d.Lookup(pPaymentDeclined)
	require.True(t, ok)
	require.Equal(t, sagadef.MessageRef{Step: "AuthorizePayment", Use: sagadef.UseFailure}, ref)
	ref, ok = d.Lookup(pPlaceOrder)
	require.True(t, ok)
	require.Equal(t, sagadef.UseStart, ref.Use)
	_, ok = d.Lookup(unknownMessage)
	require.False(t, ok)

	require.Equal(t, sagadef.Transition{From: "", Trigger: sagadef.TriggerStart, To: sReserve, Emits: []string{pReserveInventory}}, d.Transitions[0])
	for _, want := range []sagadef.Transition{
		{From: sAuthorize, Trigger: pPaymentDeclined, To: sCompReserve, Emits: []string{pReleaseInventory}},
		{From: sShipping, Trigger: sagadef.TriggerTimeout, To: sShipping, Emits: []string{pScheduleShipping}},
		{From: sShipping, Trigger: sagadef.TriggerTimeout, To: sagadef.StateManualReview},
		{From: sCompReserve, Trigger: pInventoryReleased, To: sagadef.StateFailed},
		{From: sCompReserve, Trigger: pInventoryReleaseFailed, To: sagadef.StateManualReview},
		{From: sagadef.StateManualReview, Trigger: sagadef.TriggerOperatorResolve, To: sagadef.StateCancelled},
		{From: sagadef.StateCompleted, Trigger: pInventoryFailed, To: sagadef.StateManualReview},
	} {
		require.Contains(t, d.Transitions, want)
	}
	// A timeout of a step that compensates never resends it.
	require.NotContains(t, d.Transitions, sagadef.Transition{From: sReserve, Trigger: sagadef.TriggerTimeout, To: sReserve, Emits: []string{pReserveInventory}})

	// Deterministic, and Compile is repeatable.
	again := compiled(t, placeOrder())
	require.Equal(t, d.Transitions, again.Transitions)
	require.NoError(t, again.Compile())
	require.Equal(t, d.Transitions, again.Transitions)

	m := d.Mermaid()
	require.True(t, strings.HasPrefix(m, "stateDiagram-v2\n"))
	require.Contains(t, m, "    [*] --> RESERVE_INVENTORY : start / ReserveInventory\n")
	require.Contains(t, m, "    AUTHORIZE_PAYMENT --> COMPENSATING_RESERVE_INVENTORY : PaymentDeclined / ReleaseInventory<br/>timeout / ReleaseInventory<br/>operator.compensate / ReleaseInventory\n")
	require.Contains(t, m, "    COMPLETED --> [*]\n")
	require.Empty(t, placeOrder().Mermaid())
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	step := func(i int, f func(*sagadef.Step)) func(*sagadef.Definition) {
		return func(d *sagadef.Definition) { f(&d.Steps[i]) }
	}
	tests := []struct {
		name string
		mod  func(*sagadef.Definition)
		want string
	}{
		{"no name", func(d *sagadef.Definition) { d.Name = "" }, "saga (unnamed): name is empty"},
		{"no start message", func(d *sagadef.Definition) { d.StartMessage = "" }, "start message is empty"},
		{"bad start message", func(d *sagadef.Definition) { d.StartMessage = "shop..X" }, `start "shop..X" is not a valid proto full name`},
		{"no steps", func(d *sagadef.Definition) { d.Steps = nil }, "has no steps"},
		{"negative deadline", func(d *sagadef.Definition) { d.Deadline = -time.Second }, "deadline -1s is negative"},
		{"empty step name", step(1, func(s *sagadef.Step) { s.Name = "" }), "step #2: name is empty"},
		{"bad step name", step(1, func(s *sagadef.Step) { s.Name = "2Pay" }), `name "2Pay" is not an identifier`},
		{"duplicate step", step(1, func(s *sagadef.Step) { s.Name = "ReserveInventory" }), "step ReserveInventory: name is used by two steps"},
		{"state collision", step(1, func(s *sagadef.Step) { s.Name = "Reserve_Inventory" }), "state name RESERVE_INVENTORY collides with a state of step ReserveInventory"},
		{"built-in state collision", step(3, func(s *sagadef.Step) { s.Name = "Completed" }), "step Completed: state name COMPLETED collides with the built-in state"},
		{"unspecified role", step(0, func(s *sagadef.Step) { s.Role = 0 }), "step ReserveInventory: role is unspecified"},
		{"compensatable after pivot", step(2, func(s *sagadef.Step) {
			s.Role, s.Compensation, s.CompensationReply, s.OnTimeout = sagadef.RoleCompensatable, "shop.v1.Unship", "shop.v1.Unshipped", sagadef.TimeoutCompensate
		}), "step ScheduleShipping: compensatable step follows the pivot"},
		{"second pivot", step(2, func(s *sagadef.Step) { s.Role, s.OnTimeout = sagadef.RolePivot, sagadef.TimeoutCompensate }), "step ScheduleShipping: is a second pivot (step AuthorizePayment is the pivot)"},
		{"pivot after retriable", func(d *sagadef.Definition) {
			d.Steps[1].Role, d.Steps[1].OnTimeout = sagadef.RoleRetriable, sagadef.TimeoutRetry
			d.Steps[1].MaxAttempts = 2
			d.Steps[2].Role, d.Steps[2].OnTimeout = sagadef.RolePivot, sagadef.TimeoutCompensate
		}, "step ScheduleShipping: pivot follows a retriable step"},
		{"no compensation", step(0, func(s *sagadef.Step) { s.Compensation = "" }), "step ReserveInventory: compensatable step has no compensation command"},
		{"no compensation reply", step(0, func(s *sagadef.Step) { s.CompensationReply = "" }), "compensatable step has no compensation reply"},
		{"compensation on pivot", step(1, func(s *sagadef.Step) { s.Compensation = "shop.v1.Refund" }), "step AuthorizePayment: pivot step declares a compensation"},
		{"no command", step(1, func(s *sagadef.Step) { s.Command = "" }), "step AuthorizePayment: has no command"},
		{"external with command", step(1, func(s *sagadef.Step) { s.External = true }), "external step declares command shop.v1.AuthorizePayment"},
		{"no success reply", step(1, func(s *sagadef.Step) { s.SuccessReplies = nil }), "step AuthorizePayment: has no success reply"},
		{"zero timeout", step(2, func(s *sagadef.Step) { s.Timeout = 0 }), "step ScheduleShipping: timeout 0s is not positive"},
		{"no timeout action", step(2, func(s *sagadef.Step) { s.OnTimeout = 0 }), "step ScheduleShipping: timeout action is unspecified"},
		{"retriable compensates", step(2, func(s *sagadef.Step) { s.OnTimeout = sagadef.TimeoutCompensate }), "retriable step compensates on timeout"},
		{"external retries", func(d *sagadef.Definition) {
			d.Steps[3].External, d.Steps[3].Command = true, ""
		}, ""}, // valid: ApproveOrder times out to manual review
		{"external retry", func(d *sagadef.Definition) {
			d.Steps[2].External, d.Steps[2].Command = true, ""
		}, "step ScheduleShipping: external step retries on timeout"},
		{"negative attempts", step(2, func(s *sagadef.Step) { s.MaxAttempts = -1 }), "max attempts -1 is negative"},
		{"no late policy", step(2, func(s *sagadef.Step) { s.Late = 0 }), "step ScheduleShipping: late-reply policy is unspecified"},
		{"reply used twice", step(2, func(s *sagadef.Step) { s.SuccessReplies = []string{pPaymentAuthorized} }),
			"step ScheduleShipping: success reply shop.v1.PaymentAuthorized is already the success reply of step AuthorizePayment"},
		{"failure equals success", step(2, func(s *sagadef.Step) { s.FailureReplies = []string{pShippingScheduled} }),
			"failure reply shop.v1.ShippingScheduled is already the success reply of step ScheduleShipping"},
		{"command is the start message", step(0, func(s *sagadef.Step) { s.Command = pPlaceOrder }), "command shop.v1.PlaceOrder is already the start message"},
		{"message named like a trigger", step(2, func(s *sagadef.Step) { s.FailureReplies = []string{"timeout"} }),
			`failure reply "timeout" collides with the built-in trigger`},
		{"operator trigger name", step(2, func(s *sagadef.Step) { s.FailureReplies = []string{sagadef.TriggerOperatorRetry} }),
			`"operator.retry" collides with the built-in trigger`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := placeOrder(tt.mod)
			err := d.Compile()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.ErrorIs(t, err, sagadef.ErrInvalidDefinition)
			require.ErrorContains(t, err, tt.want)
			require.Contains(t, err.Error(), "saga ")
			var de *sagadef.DefinitionError
			require.True(t, errors.As(err, &de))
			require.False(t, d.Compiled())
			require.Nil(t, d.Transitions)
		})
	}
}

func TestCompileReportsEveryProblem(t *testing.T) {
	t.Parallel()
	d := placeOrder(func(d *sagadef.Definition) {
		d.Steps[0].Compensation = ""
		d.Steps[2].Timeout = 0
	})
	err := d.Compile()
	require.ErrorContains(t, err, "saga shop.v1.PlaceOrderSaga: step ReserveInventory: compensatable step has no compensation command")
	require.ErrorContains(t, err, "saga shop.v1.PlaceOrderSaga: step ScheduleShipping: timeout 0s is not positive")
}

// TestRandomScripts drives both definitions (and variants of their
// policies) through random scripts of replies (to the pending command, to
// earlier ones, to nothing), duplicates, timeouts, deadlines and operator
// actions. The harness fails the test when Apply modifies its input or takes
// a transition that is not in the table.
func TestRandomScripts(t *testing.T) {
	t.Parallel()
	defs := []*sagadef.Definition{compiled(t, placeOrder()), compiled(t, quoteApproval())}
	for _, p := range []sagadef.LatePolicy{sagadef.LateIgnore, sagadef.LateManualReview, sagadef.LateApplyIfWaiting} {
		defs = append(defs,
			compiled(t, placeOrder(late("ReserveInventory", p), late("AuthorizePayment", p), late("ScheduleShipping", p), late("ApproveOrder", p))),
			compiled(t, quoteApproval(late("PrepareQuote", p), late("AwaitApproval", p), late("SendContract", p))),
			compiled(t, placeOrder(cancellable, late("AuthorizePayment", p))),
			compiled(t, quoteApproval(cancellable, late("AwaitApproval", p))))
	}
	r := rand.New(rand.NewPCG(42, 7))
	// seenRows collects, per saga, the transitions the scripts took across
	// all its variants.
	seenRows := map[string]map[string]bool{}
	for _, d := range defs {
		if seenRows[d.Name] == nil {
			seenRows[d.Name] = map[string]bool{}
		}
		var incoming []string
		for _, s := range d.Steps {
			incoming = append(incoming, s.SuccessReplies...)
			incoming = append(incoming, s.FailureReplies...)
			if s.CompensationReply != "" {
				incoming = append(incoming, s.CompensationReply)
			}
			incoming = append(incoming, s.CompensationFailureReplies...)
		}
		if d.Cancel.Message != "" {
			incoming = append(incoming, d.Cancel.Message, d.Cancel.Message)
		}
		incoming = append(incoming, unknownMessage)
		for range 80 {
			h := sagatest.New(t, d, hooks())
			h.Start(msg(d.StartMessage))
			for range 25 {
				switch k := r.IntN(20); {
				case k < 10:
					cause := h.Instance().PendingMessageID
					if sent := h.Sent(); r.IntN(3) == 0 && len(sent) > 0 {
						cause = sent[r.IntN(len(sent))].MessageID
					}
					m := msg(incoming[r.IntN(len(incoming))])
					if _, err := h.TryApply(sagadef.Trigger{Kind: m.SagaMessageInfo().FullName, Message: m, CausationID: cause}); err != nil {
						// A reply naming another step's command is parked,
						// not applied.
						require.ErrorIs(t, err, sagadef.ErrMisaddressed)
					}
				case k < 11 && len(h.History()) > 1 && h.History()[len(h.History())-1].Trigger.Message != nil:
					h.Duplicate()
				case k < 14 && !h.Instance().TimeoutAt.IsZero():
					h.Timeout()
				case k < 15 && !h.Instance().DeadlineAt.IsZero():
					h.Deadline()
				case k < 20:
					ops := []string{sagadef.TriggerOperatorRetry, sagadef.TriggerOperatorCompensate, sagadef.TriggerOperatorResolve, sagadef.TriggerOperatorCancel}
					to := []string{sagadef.StateCompleted, sagadef.StateFailed, sagadef.StateCancelled}
					op := ops[r.IntN(len(ops))]
					trig := sagadef.Trigger{Kind: op, Operator: "ops", Reason: "random"}
					if op == sagadef.TriggerOperatorResolve {
						trig.ResolveTo = to[r.IntN(len(to))]
					}
					if _, err := h.TryApply(trig); err != nil {
						require.True(t, errors.Is(err, sagadef.ErrInvalidTrigger) || errors.Is(err, sagadef.ErrTerminal), err)
					}
				}
			}
			for _, e := range h.History() {
				if e.Result.IsTransition() {
					seenRows[d.Name][e.Result.From+" "+e.Result.To] = true
				}
			}
		}
	}
	// The scripts reach a good part of each table (so the check above is
	// not vacuous).
	for _, d := range defs[:2] {
		require.Greater(t, len(seenRows[d.Name]), 25, d.Name)
	}
}

func TestApplyDoesNotAliasItsInput(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder())
	h := sagatest.New(t, d, hooks())
	h.Start(msg(pPlaceOrder))
	in := h.Instance()
	res, err := d.Apply(t.Context(), h.Env(), in, sagadef.Trigger{Kind: pInventoryReserved, Message: msg(pInventoryReserved), CausationID: in.PendingMessageID})
	require.NoError(t, err)
	require.Equal(t, in.Version+1, res.Instance.Version)
	require.NotSame(t, in.Data, res.Instance.Data)
	require.Empty(t, sagatest.Applied(in.Data))
	res.Instance.Progress.Sent["injected"] = "x"
	res.Instance.Progress.Outcomes["injected"] = "x"
	res.Instance.Progress.Completed[0] = "injected"
	require.NotContains(t, in.Progress.Sent, "injected")
	require.Nil(t, in.Progress.Outcomes)
	require.Nil(t, in.Progress.Completed)
}

func TestClassify(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder())
	h := sagatest.New(t, d, hooks())
	h.Start(msg(pPlaceOrder))
	reserve := h.Instance().PendingMessageID
	inst := h.Instance()
	require.Equal(t, sagadef.ClassNew, d.Classify(inst, sagadef.Trigger{Kind: pInventoryReserved, CausationID: reserve}))
	require.Equal(t, sagadef.ClassInvalid, d.Classify(inst, sagadef.Trigger{Kind: pInventoryReserved, CausationID: "other"}),
		"a misaddressed reply: Apply refuses it")
	require.Equal(t, sagadef.ClassInvalid, d.Classify(inst, sagadef.Trigger{Kind: unknownMessage}))
	require.Equal(t, sagadef.ClassNew, d.Classify(inst, sagadef.Trigger{Kind: sagadef.TriggerTimeout}))
	require.Equal(t, sagadef.ClassInvalid, d.Classify(inst, sagadef.Trigger{Kind: sagadef.TriggerOperatorRetry}), "no operator")
	h.Reply(msg(pInventoryReserved))
	inst = h.Instance()
	require.Equal(t, sagadef.ClassDuplicate, d.Classify(inst, sagadef.Trigger{Kind: pInventoryReserved, CausationID: reserve}))
	require.Equal(t, sagadef.ClassConflicting, d.Classify(inst, sagadef.Trigger{Kind: pInventoryFailed, CausationID: reserve}))
	require.Equal(t, "conflicting", sagadef.ClassConflicting.String())
}
