package sagadef_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// TestEarlyEvents: an External step's event that arrives while the saga is
// still on its way to the step (Place Order with checks: the fraud team's
// decision comes while the order is being validated) is recorded, not
// refused: it settles the step when the saga enters it, and is discarded
// when the saga compensates, skips the step or ends before reaching it.
func TestEarlyEvents(t *testing.T) {
	t.Parallel()
	early := func(h *sagatest.Harness, event string) {
		t.Helper()
		h.ReplyTo("", msg(event)) // an event names no command
		h.RequireClass(sagadef.ClassEarly)
		h.RequireState(sValidate)
		h.RequireSent()
		require.Equal(t, event, h.Instance().Progress.Outcomes["AwaitFraudClearance"])
		require.Contains(t, h.Last().Note, "recorded early, while the saga is at step ValidateOrder")
	}
	tests := []struct {
		name  string
		def   *sagadef.Definition
		hooks sagadef.Hooks
		run   func(t *testing.T, h *sagatest.Harness)
	}{
		{"an early success settles the step when the saga enters it", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.Reply(msg(pOrderValid))
			h.RequireState(sReserve)
			h.Reply(msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sAuthorize)
			h.RequireSent(pAuthorizePayment)
			require.Equal(t, []string{"ValidateOrder", "ReserveInventory", "AwaitFraudClearance"}, h.Instance().Progress.Completed)
			require.Contains(t, h.Last().Note, "FraudCleared, recorded early for step AwaitFraudClearance, settles it")
		}},
		{"an early failure compensates when the saga enters the step", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudFlagged)
			h.Reply(msg(pOrderValid))
			h.Reply(msg(pInventoryReserved))
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, "step AwaitFraudClearance failed with FraudFlagged", h.Instance().LastError)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
		}},
		{"an early event is discarded when the saga compensates before the step", placeOrder(checked, cancellable), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.Reply(msg(pOrderValid))
			h.Cancel(msg(pCancelOrder))
			h.RequireState(sCompReserve)
			require.NotContains(t, h.Instance().Progress.Outcomes, "AwaitFraudClearance")
			require.Contains(t, h.Last().Note, "FraudCleared, recorded early for step AwaitFraudClearance, discarded: the saga compensates")
			// Its repeat is no part of the conversation now, not a duplicate.
			h.ReplyTo("", msg(pFraudFlagged))
			h.RequireClass(sagadef.ClassInvalid)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateCancelled)
		}},
		{"an early event is discarded when the saga fails before the step", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.Reply(msg(pOrderInvalid))
			h.RequireState(sagadef.StateFailed)
			require.NotContains(t, h.Instance().Progress.Outcomes, "AwaitFraudClearance")
			require.Contains(t, h.Last().Note, "discarded: the saga compensates")
		}},
		{"an early event is discarded when the decider skips its step", placeOrder(checked, conditional("AwaitFraudClearance")), skipping("AwaitFraudClearance"), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.Reply(msg(pOrderValid))
			h.Reply(msg(pInventoryReserved))
			h.RequireState(sAuthorize)
			h.RequireSent(pAuthorizePayment)
			require.Equal(t, []string{"AwaitFraudClearance"}, h.Instance().Progress.Skipped)
			require.NotContains(t, h.Instance().Progress.Outcomes, "AwaitFraudClearance")
			require.Contains(t, h.Last().Note, "FraudCleared, recorded early for step AwaitFraudClearance, discarded: the decider skipped the step")
			h.ReplyTo("", msg(pFraudFlagged))
			h.RequireClass(sagadef.ClassInvalid)
		}},
		{"an early event is discarded when an operator resolves the saga before the step", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.Deadline()
			h.RequireState(sagadef.StateManualReview)
			h.Resolve(sagadef.StateFailed, "order withdrawn by phone")
			require.NotContains(t, h.Instance().Progress.Outcomes, "AwaitFraudClearance")
			require.Contains(t, h.Last().Note, "discarded: the saga ended FAILED")
		}},
		{"the same early event again is a duplicate", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			v := h.Instance().Version
			h.Duplicate()
			h.RequireClass(sagadef.ClassDuplicate)
			require.Equal(t, v, h.Instance().Version)
			h.ReplyTo("", msg(pFraudCleared)) // another message id, same outcome
			h.RequireClass(sagadef.ClassDuplicate)
			h.RequireState(sValidate)
		}},
		{"another early event for the step conflicts", placeOrder(checked), hooks(), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			early(h, pFraudCleared)
			h.ReplyTo("", msg(pFraudFlagged))
			h.RequireClass(sagadef.ClassConflicting)
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "conflicting reply FraudFlagged for step AwaitFraudClearance, which FraudCleared already settled")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sagatest.New(t, compiled(t, tt.def), tt.hooks)
			tt.run(t, h)
		})
	}
}
