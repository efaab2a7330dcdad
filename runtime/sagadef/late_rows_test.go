package sagadef_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// TestLateReplyRows runs rows of the late-reply table (docs/options.md)
// with real hooks, so that what they record, fold and say is visible:
// TestLateReplyTable checks every row under every policy and step shape by
// exploration, these check what an operator finds afterwards.
func TestLateReplyRows(t *testing.T) {
	t.Parallel()
	// placeOrderReview: ReserveInventory (compensatable, compensates on
	// timeout, 3 sends) sends late replies to manual review.
	placeOrderReview := func(mods ...func(*sagadef.Definition)) *sagadef.Definition {
		return placeOrder(append(mods, late("ReserveInventory", sagadef.LateManualReview))...)
	}
	tests := []struct {
		name string
		def  func(...func(*sagadef.Definition)) *sagadef.Definition
		run  func(t *testing.T, h *sagatest.Harness)
	}{
		{"success reply after its compensation confirmed: manual review", placeOrderReview, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			h.Timeout()
			h.RequireState(sCompReserve)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
			// The reservation happened after all, and nothing says the
			// release undid it: a human checks.
			h.ReplyTo(reserve, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			h.RequireSent()
			inst := h.Instance()
			require.Equal(t, sagadef.StateFailed, inst.Progress.ReviewFrom)
			require.Contains(t, inst.ReviewReason, "late InventoryReserved for step ReserveInventory, which stopped waiting; the saga is FAILED")
			require.Contains(t, inst.ReviewReason, "check that its compensation ReleaseInventory undid it")
			require.Equal(t, pInventoryReserved, inst.Progress.Outcomes["ReserveInventory"])
			require.Contains(t, sagatest.Applied(inst.Data), pInventoryReserved, "folded into the data for the operator")
			h.Resolve(sagadef.StateFailed, "stock checked: released")
			h.RequireState(sagadef.StateFailed)
		}},
		{"success reply after its compensation was sent: audited under ignore, naming the compensation", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			h.Timeout()
			v := h.Instance().Version
			h.ReplyTo(reserve, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sCompReserve)
			require.Equal(t, v, h.Instance().Version)
			require.Contains(t, h.Last().Note, "audited (late policy: ignore): its compensation ReleaseInventory was sent naming the command")
		}},
		{"failure reply after the step stopped: audited, it agrees", placeOrderReview, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			h.Timeout()
			v := h.Instance().Version
			h.ReplyTo(reserve, msg(pInventoryFailed))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sCompReserve)
			require.Equal(t, v, h.Instance().Version)
			require.Contains(t, h.Last().Note, "it agrees with what the saga does")
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
		}},
		{"compensation reply to an earlier attempt: applied under every policy", placeOrderReview, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Timeout()
			first := h.Instance().PendingMessageID
			h.Timeout()
			h.RequireState(sCompReserve)
			require.Equal(t, 2, h.Instance().Attempt)
			// The first release's confirmation, while the saga waits for
			// the resent one: the compensation is done.
			h.ReplyTo(first, msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateFailed)
			require.Contains(t, h.Last().Note, "applied: every attempt sends the same compensating command")
			// The resent release's confirmation is a duplicate.
			h.ReplyTo(h.LastSent(pReleaseInventory).MessageID, msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassDuplicate)
		}},
		{"failure reply to an earlier attempt: applied under apply if waiting", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			first := h.Instance().PendingMessageID
			h.Timeout()
			h.ReplyTo(first, msg(pShippingRejected))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "retriable step ScheduleShipping failed with ShippingRejected")
		}},
		{"success reply after the saga was resolved COMPLETED: audited, it agrees", withLate("ApproveOrder", sagadef.LateManualReview), func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			h.Reply(msg(pShippingScheduled))
			approve := h.Instance().PendingMessageID
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			h.Resolve(sagadef.StateCompleted, "approved by phone")
			v := h.Instance().Version
			h.ReplyTo(approve, msg(pOrderApproved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateCompleted)
			require.Equal(t, v, h.Instance().Version)
		}},
		{"failure reply after the saga was resolved COMPLETED: the effect it counts on did not happen", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			payment := h.Instance().PendingMessageID
			h.Deadline()
			h.RequireState(sagadef.StateManualReview)
			h.Resolve(sagadef.StateCompleted, "paid by bank transfer")
			h.ReplyTo(payment, msg(pPaymentDeclined))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, sagadef.StateCompleted, h.Instance().Progress.ReviewFrom)
			require.Contains(t, h.Instance().ReviewReason, "the saga counts on the step's effect, which did not happen")
		}},
		{"compensation failure after the saga was resolved FAILED: manual review whatever the policy", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Timeout()
			release := h.Instance().PendingMessageID
			h.Timeout()
			h.Timeout()
			h.Timeout() // three sends of the release, unanswered
			h.RequireState(sagadef.StateManualReview)
			h.Resolve(sagadef.StateFailed, "released by hand")
			h.ReplyTo(release, msg(pInventoryReleaseFailed))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "the step's effect is still in place")
		}},
		{"compensation reply after an operator's cancel: audited", placeOrderReview, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Timeout()
			release := h.Instance().PendingMessageID
			h.OperatorCancel("fraud")
			h.RequireState(sagadef.StateCancelled)
			v := h.Instance().Version
			h.ReplyTo(release, msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateCancelled)
			require.Equal(t, v, h.Instance().Version)
		}},
		{"compensation reply after the saga was resolved COMPLETED: manual review", placeOrderReview, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Timeout()
			release := h.Instance().PendingMessageID
			h.Timeout()
			h.Timeout()
			h.Timeout() // three sends of the release, unanswered
			h.Resolve(sagadef.StateCompleted, "order delivered by hand")
			h.ReplyTo(release, msg(pInventoryReleased))
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "the step is undone though the saga completed")
		}},
		{"approval in review before the saga reached the step: recorded early, settles the step after the retry", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Timeout()
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, sPrepare, h.Instance().Progress.ReviewFrom)
			h.Reply(msg(qQuoteApproved))
			h.RequireClass(sagadef.ClassEarly)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, qQuoteApproved, h.Instance().Progress.Outcomes["AwaitApproval"])
			require.Contains(t, h.Last().Note, "recorded early")
			h.Duplicate()
			h.RequireClass(sagadef.ClassDuplicate)
			h.OperatorRetry("pricing is back")
			h.RequireState(sPrepare)
			h.RequireSent(qPrepareQuote)
			h.Reply(msg(qQuotePrepared))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sContract)
			h.RequireSent(qSendContract)
			require.Equal(t, []string{"PrepareQuote", "AwaitApproval"}, h.Instance().Progress.Completed)
			require.Contains(t, h.Last().Note, "QuoteApproved, recorded early for step AwaitApproval, settles it")
		}},
		{"rejection in review before the saga reached the step: the quote is withdrawn after the retry", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Timeout()
			h.Timeout()
			h.Reply(msg(qQuoteRejected))
			h.RequireState(sagadef.StateManualReview)
			h.OperatorRetry("pricing is back")
			h.Reply(msg(qQuotePrepared))
			h.RequireState(sCompPrepare)
			h.RequireSent(qWithdrawQuote)
			require.Equal(t, "step AwaitApproval failed with QuoteRejected", h.Instance().LastError)
		}},
		{"a second, different event for a step not reached yet conflicts", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Timeout()
			h.Timeout()
			h.Reply(msg(qQuoteApproved))
			h.OperatorRetry("pricing is back")
			h.Reply(msg(qQuoteRejected))
			h.RequireClass(sagadef.ClassConflicting)
			h.RequireState(sagadef.StateManualReview)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sagatest.New(t, compiled(t, tt.def()), hooks())
			tt.run(t, h)
		})
	}
}
