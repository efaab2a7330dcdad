package sagadef_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

const (
	sValidate = "VALIDATE_ORDER"
	sFraud    = "AWAIT_FRAUD_CLEARANCE"
)

// TestCheckSteps runs Place Order with a check step before its
// compensatable step and an external check step after it: a check needs no
// compensation, its failure compensates what ran before it, and
// compensation passes over it.
func TestCheckSteps(t *testing.T) {
	t.Parallel()
	toFraud := func(h *sagatest.Harness) {
		h.Start(msg(pPlaceOrder))
		h.RequireState(sValidate)
		h.RequireSent(pValidateOrder)
		h.Reply(msg(pOrderValid))
		h.RequireState(sReserve)
		h.Reply(msg(pInventoryReserved))
		h.RequireState(sFraud)
		h.RequireSent()
	}
	tests := []struct {
		name string
		run  func(t *testing.T, h *sagatest.Harness)
	}{
		{"happy path", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Reply(msg(pFraudCleared))
			h.RequireState(sAuthorize)
			h.RequireSent(pAuthorizePayment)
			h.Reply(msg(pPaymentAuthorized))
			h.Reply(msg(pShippingScheduled))
			h.Reply(msg(pOrderApproved))
			h.RequireState(sagadef.StateCompleted)
			require.Equal(t, []string{"ValidateOrder", "ReserveInventory", "AwaitFraudClearance", "AuthorizePayment",
				"ScheduleShipping", "ApproveOrder"}, h.Instance().Progress.Completed)
		}},
		{"a failed first check fails with nothing to compensate", func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pOrderInvalid))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateFailed)
			h.RequireSent()
			require.Empty(t, h.Instance().Progress.SentCompensations)
			require.Contains(t, h.Instance().LastError, "step ValidateOrder failed with OrderInvalid")
		}},
		{"a failed check compensates the steps before it", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Reply(msg(pFraudFlagged))
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
			require.Equal(t, []string{"ReserveInventory"}, h.Instance().Progress.Compensated)
		}},
		{"compensation passes over check steps", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Reply(msg(pFraudCleared))
			h.Reply(msg(pPaymentDeclined))
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
			h.RequireSent()
			require.Equal(t, []string{"ReserveInventory"}, h.Instance().Progress.Compensated)
			require.Len(t, h.Instance().Progress.SentCompensations, 1)
		}},
		{"a check's timeout compensates", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Timeout()
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, []string{"AwaitFraudClearance"}, h.Instance().Progress.Stopped)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
			// The fraud team's late clearance: nothing to undo.
			h.Reply(msg(pFraudCleared))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateFailed)
			require.Contains(t, h.Last().Note, "a check step leaves nothing to undo")
		}},
		{"a check command is retried on timeout", func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Timeout()
			h.RequireState(sValidate)
			h.RequireSent(pValidateOrder)
			require.Equal(t, 2, h.Instance().Attempt)
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
		}},
		{"a cancel while a check waits compensates and ends cancelled", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Cancel(msg(pCancelOrder))
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateCancelled)
		}},
		{"a completed check is no point of no return", func(t *testing.T, h *sagatest.Harness) {
			toFraud(h)
			h.Reply(msg(pFraudCleared))
			h.Cancel(msg(pCancelOrder))
			h.RequireState(sCompReserve)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, sagatest.New(t, compiled(t, placeOrder(checked, cancellable)), hooks()))
		})
	}
}

// TestCheckStepStates: a check step has one state, waiting for its reply;
// no compensating state and no compensating row in the table.
func TestCheckStepStates(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(checked))
	var names []string
	for _, s := range d.States {
		names = append(names, s.Name)
	}
	require.Contains(t, names, sValidate)
	require.Contains(t, names, sFraud)
	require.NotContains(t, names, sagadef.CompensatingStateName("ValidateOrder"))
	require.NotContains(t, names, sagadef.CompensatingStateName("AwaitFraudClearance"))
	for _, tr := range d.Transitions {
		if tr.From == sFraud && tr.Trigger == pFraudFlagged {
			require.Equal(t, sCompReserve, tr.To)
			require.Equal(t, []string{pReleaseInventory}, tr.Emits)
		}
		if tr.From == sValidate && tr.Trigger == pOrderInvalid {
			require.Equal(t, sagadef.StateFailed, tr.To)
		}
	}
}

// TestCheckStepCompileErrors: a check declares no compensation and runs
// before the pivot.
func TestCheckStepCompileErrors(t *testing.T) {
	t.Parallel()
	withComp := placeOrder(checked, func(d *sagadef.Definition) {
		d.Steps[0].Compensation = pReleaseInventory
	})
	require.ErrorContains(t, withComp.Compile(), "check step declares a compensation")
	late := placeOrder(func(d *sagadef.Definition) {
		d.Steps[2].Role = sagadef.RoleCheck
	})
	require.ErrorContains(t, late.Compile(), "check step follows the pivot or a retriable step")
}

// conditional makes the named steps conditional.
func conditional(names ...string) func(*sagadef.Definition) {
	return func(d *sagadef.Definition) {
		for i := range d.Steps {
			if slices.Contains(names, d.Steps[i].Name) {
				d.Steps[i].Conditional = true
			}
		}
	}
}

// skipping returns the fixture hooks deciding that the named steps are
// skipped ("not needed") and every other conditional step runs.
func skipping(names ...string) sagadef.Hooks {
	return sagatest.Skipping(hooks(), func(step string, _ proto.Message) (bool, string) {
		return slices.Contains(names, step), "not needed"
	})
}

// TestConditionalSteps runs Place Order with conditional steps the
// decider skips or runs from the saga data.
func TestConditionalSteps(t *testing.T) {
	t.Parallel()
	def := func() *sagadef.Definition {
		return compiled(t, placeOrder(checked, cancellable, conditional("ValidateOrder", "ReserveInventory", "AwaitFraudClearance")))
	}
	t.Run("a skipped step sends nothing and is recorded", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, def(), skipping("AwaitFraudClearance"))
		h.Start(msg(pPlaceOrder))
		h.Reply(msg(pOrderValid))
		h.Reply(msg(pInventoryReserved))
		h.RequireClass(sagadef.ClassNew)
		h.RequireState(sAuthorize)
		h.RequireSent(pAuthorizePayment)
		require.Contains(t, h.Last().Note, "skipped conditional step AwaitFraudClearance: not needed")
		require.Equal(t, []string{"AwaitFraudClearance"}, h.Instance().Progress.Skipped)
		require.NotContains(t, h.Instance().Progress.Completed, "AwaitFraudClearance")

		// The skipped step's event is no part of the conversation now.
		res, err := h.TryApply(sagadef.Trigger{Kind: pFraudCleared, Message: msg(pFraudCleared), MessageID: "m-fraud"})
		require.NoError(t, err)
		require.Equal(t, sagadef.ClassInvalid, res.Class)
		require.Contains(t, res.Note, "which the saga skipped")

		h.Reply(msg(pPaymentAuthorized))
		h.Reply(msg(pShippingScheduled))
		h.Reply(msg(pOrderApproved))
		h.RequireState(sagadef.StateCompleted)
	})
	t.Run("the decider can skip the first step", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, def(), skipping("ValidateOrder"))
		h.Start(msg(pPlaceOrder))
		h.RequireState(sReserve)
		h.RequireSent(pReserveInventory)
		require.Contains(t, h.Last().Note, "skipped conditional step ValidateOrder")
	})
	t.Run("a skipped compensatable step is not compensated", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, def(), skipping("ReserveInventory"))
		h.Start(msg(pPlaceOrder))
		h.Reply(msg(pOrderValid))
		h.RequireState(sFraud)
		h.Reply(msg(pFraudFlagged))
		h.RequireState(sagadef.StateFailed)
		h.RequireSent()
		require.Empty(t, h.Instance().Progress.SentCompensations)
	})
	t.Run("consecutive skips", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, def(), skipping("ValidateOrder", "ReserveInventory", "AwaitFraudClearance"))
		h.Start(msg(pPlaceOrder))
		h.RequireState(sAuthorize)
		h.RequireSent(pAuthorizePayment)
		require.Equal(t, []string{"ValidateOrder", "ReserveInventory", "AwaitFraudClearance"}, h.Instance().Progress.Skipped)
		h.Reply(msg(pPaymentDeclined))
		h.RequireState(sagadef.StateFailed)
		h.RequireSent()
	})
	t.Run("a step the decider runs is an ordinary step", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, def(), skipping())
		h.Start(msg(pPlaceOrder))
		h.RequireState(sValidate)
		h.Reply(msg(pOrderValid))
		h.Reply(msg(pInventoryReserved))
		h.RequireState(sFraud)
		require.Empty(t, h.Instance().Progress.Skipped)
	})
	t.Run("hooks without a Skipper are an error", func(t *testing.T) {
		t.Parallel()
		d := def()
		_, err := d.Begin(context.Background(), sagadef.Env{Now: sagatest.Epoch, NewID: func() string { return "id-1" },
			Hooks: struct{ sagadef.Hooks }{hooks()}}, "saga-1", msg(pPlaceOrder))
		require.ErrorContains(t, err, "step ValidateOrder is conditional, but the hooks")
	})
}

// TestConditionalCompileErrors: the pivot is never conditional, and a saga
// runs at least one step.
func TestConditionalCompileErrors(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, placeOrder(conditional("AuthorizePayment")).Compile(),
		"the pivot is conditional; the point of no return cannot be skipped")
	require.ErrorContains(t, quoteApproval(func(d *sagadef.Definition) {
		d.Steps = d.Steps[:1]
		d.Steps[0].Conditional = true
	}).Compile(), "every step is conditional")
}

// TestConditionalTable: the table leads past a conditional step to the
// next one.
func TestConditionalTable(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(checked, conditional("AwaitFraudClearance")))
	var tos []string
	for _, tr := range d.Transitions {
		if tr.From == sReserve && tr.Trigger == pInventoryReserved {
			tos = append(tos, tr.To)
		}
	}
	// Past the skipped step, and where the fraud team's decision, recorded
	// while the saga was in review before it, leads.
	require.ElementsMatch(t, []string{sFraud, sAuthorize, sCompReserve}, tos)
}
