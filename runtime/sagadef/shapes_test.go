package sagadef_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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
