package sagadef_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

const (
	sReserve     = "RESERVE_INVENTORY"
	sAuthorize   = "AUTHORIZE_PAYMENT"
	sShipping    = "SCHEDULE_SHIPPING"
	sApprove     = "APPROVE_ORDER"
	sCompReserve = "COMPENSATING_RESERVE_INVENTORY"
	sPrepare     = "PREPARE_QUOTE"
	sAwait       = "AWAIT_APPROVAL"
	sContract    = "SEND_CONTRACT"
	sCompPrepare = "COMPENSATING_PREPARE_QUOTE"
)

// toShipping drives a Place Order saga to SCHEDULE_SHIPPING.
func toShipping(h *sagatest.Harness) {
	h.Start(msg(pPlaceOrder))
	h.Reply(msg(pInventoryReserved))
	h.Reply(msg(pPaymentAuthorized))
}

func TestScenarios(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		def  func(...func(*sagadef.Definition)) *sagadef.Definition
		run  func(t *testing.T, h *sagatest.Harness)
	}{
		{"happy path", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.RequireState(sReserve)
			h.RequireSent(pReserveInventory)
			inst := h.Instance()
			require.Equal(t, "order-1", inst.BusinessKey)
			require.Equal(t, int64(1), inst.Version)
			require.Equal(t, 1, inst.Attempt)
			require.Equal(t, h.Last().Emit[0].MessageID, inst.PendingMessageID)
			require.Equal(t, sagatest.Epoch.Add(30*time.Second), inst.TimeoutAt)
			require.Equal(t, sagatest.Epoch.Add(time.Hour), inst.DeadlineAt)

			h.Reply(msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sAuthorize)
			h.RequireSent(pAuthorizePayment)
			h.Reply(msg(pPaymentAuthorized))
			h.RequireState(sShipping)
			h.RequireSent(pScheduleShipping)
			h.Reply(msg(pShippingScheduled))
			h.RequireState(sApprove)
			h.RequireSent(pApproveOrder)
			h.Reply(msg(pOrderApproved))
			h.RequireState(sagadef.StateCompleted)
			h.RequireSent()

			inst = h.Instance()
			require.Equal(t, int64(5), inst.Version)
			require.True(t, inst.TimeoutAt.IsZero())
			require.True(t, inst.DeadlineAt.IsZero())
			require.Empty(t, inst.PendingMessageID)
			require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ApproveOrder"}, inst.Progress.Completed)
			require.Equal(t, []string{pInventoryReserved, pPaymentAuthorized, pShippingScheduled, pOrderApproved}, sagatest.Applied(inst.Data))
			require.Len(t, inst.Progress.Sent, 4)
		}},
		{"inventory failure fails without compensation", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryFailed))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateFailed)
			h.RequireSent()
			require.Empty(t, h.Instance().Progress.SentCompensations)
			require.Equal(t, pInventoryFailed, h.Instance().Progress.Outcomes["ReserveInventory"])
			require.Contains(t, h.Instance().LastError, "InventoryFailed")
		}},
		{"payment failure releases inventory", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, h.Last().Emit[0].MessageID, h.Instance().PendingMessageID)
			require.Empty(t, h.Last().Emit[0].Compensates, "the step answered: its command ran, nothing can overtake it")
			require.True(t, h.Instance().DeadlineAt.IsZero(), "the deadline bounds the forward path only")
			h.Reply(msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateFailed)
			require.Equal(t, []string{"ReserveInventory"}, h.Instance().Progress.Compensated)
		}},
		{"shipping timeout retries with the same idempotency key", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			first := h.LastSent(pScheduleShipping)
			h.Timeout()
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sShipping)
			h.RequireSent(pScheduleShipping)
			again := h.LastSent(pScheduleShipping)
			require.NotEqual(t, first.MessageID, again.MessageID)
			require.Equal(t, first.Message.IdempotencyKey(), again.Message.IdempotencyKey())
			require.Equal(t, 2, h.Instance().Attempt)
			require.Equal(t, again.MessageID, h.Instance().PendingMessageID)
			require.Equal(t, h.Now().Add(time.Minute), h.Instance().TimeoutAt)
			h.Reply(msg(pShippingScheduled))
			h.RequireState(sApprove)
		}},
		{"retry budget exhausted goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			h.Timeout()
			h.Timeout()
			h.RequireState(sShipping)
			require.Equal(t, 3, h.Instance().Attempt)
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			h.RequireSent()
			require.Contains(t, h.Instance().ReviewReason, "retry budget exhausted after 3 attempts")
			require.Equal(t, sShipping, h.Instance().Progress.ReviewFrom)
			require.True(t, h.Instance().TimeoutAt.IsZero())
		}},
		{"timed-out compensatable step is compensated", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			cmd := h.LastSent(pReserveInventory).Message
			h.Timeout()
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, []string{"ReserveInventory"}, h.Instance().Progress.Stopped)
			require.Equal(t, message.OnceKey(cmd, 0), h.LastSent(pReleaseInventory).Compensates,
				"the compensation names the command it undoes, which may still be on its way")
			// The reservation happened after all: the compensation covers it.
			v := h.Instance().Version
			h.ReplyTo(reserve, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sCompReserve)
			require.Equal(t, v, h.Instance().Version)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
		}},
		{"pivot timeout compensates the steps before it", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Timeout()
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, []string{"AuthorizePayment"}, h.Instance().Progress.Stopped)
		}},
		{"late reply to an earlier attempt: apply if waiting", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			first := h.Instance().PendingMessageID
			h.Timeout()
			h.ReplyTo(first, msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sApprove)
			h.RequireSent(pApproveOrder)
			// The answer to the second attempt is now a duplicate.
			h.ReplyTo(h.LastSent(pScheduleShipping).MessageID, msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassDuplicate)
		}},
		{"late reply to an earlier attempt: ignore", withLate("ScheduleShipping", sagadef.LateIgnore), func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			first := h.Instance().PendingMessageID
			h.Timeout()
			before := h.Instance()
			h.ReplyTo(first, msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sShipping)
			h.RequireSent()
			require.Equal(t, before.Version, h.Instance().Version)
			require.Empty(t, h.Instance().Progress.Outcomes["ScheduleShipping"])
			h.Reply(msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sApprove)
		}},
		{"late reply to an earlier attempt: manual review", withLate("ScheduleShipping", sagadef.LateManualReview), func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			first := h.Instance().PendingMessageID
			h.Timeout()
			h.ReplyTo(first, msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, pShippingScheduled, h.Instance().Progress.Outcomes["ScheduleShipping"])
			// The operator's retry knows the step succeeded and continues.
			h.Operator(sagadef.TriggerOperatorRetry, "shipping confirmed by phone")
			h.RequireState(sApprove)
			h.RequireSent(pApproveOrder)
			require.Empty(t, h.Instance().ReviewReason)
			require.Empty(t, h.Instance().Progress.ReviewFrom)
		}},
		{"late success of a timed-out pivot goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			payment := h.Instance().PendingMessageID
			h.Timeout()
			h.RequireState(sCompReserve)
			h.ReplyTo(payment, msg(pPaymentAuthorized))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, sCompReserve, h.Instance().Progress.ReviewFrom)
			require.Contains(t, h.Instance().ReviewReason, "PaymentAuthorized")
		}},
		{"late success of a timed-out pivot under ignore is audited only", withLate("AuthorizePayment", sagadef.LateIgnore), func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			payment := h.Instance().PendingMessageID
			h.Timeout()
			v := h.Instance().Version
			h.ReplyTo(payment, msg(pPaymentAuthorized))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sCompReserve)
			require.Equal(t, v, h.Instance().Version)
		}},
		{"duplicate reply with a new message id", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			before := h.Instance()
			res := h.Duplicate()
			h.RequireClass(sagadef.ClassDuplicate)
			h.RequireState(sAuthorize)
			h.RequireSent()
			require.Equal(t, before.Version, res.Instance.Version)
			require.False(t, res.IsTransition())
			require.Equal(t, []string{pInventoryReserved}, sagatest.Applied(h.Instance().Data), "a duplicate is not folded twice")
		}},
		{"conflicting reply goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			h.Reply(msg(pInventoryReserved))
			h.ReplyTo(reserve, msg(pInventoryFailed))
			h.RequireClass(sagadef.ClassConflicting)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, sAuthorize, h.Instance().Progress.ReviewFrom)
			require.Contains(t, h.Instance().ReviewReason, "conflicting reply InventoryFailed for step ReserveInventory")
			require.Equal(t, pInventoryReserved, h.Instance().Progress.Outcomes["ReserveInventory"], "the first outcome stands")
		}},
		{"conflicting reply after completion goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			shipping := h.Instance().PendingMessageID
			h.Reply(msg(pShippingScheduled))
			h.Reply(msg(pOrderApproved))
			h.RequireState(sagadef.StateCompleted)
			h.ReplyTo(shipping, msg(pShippingRejected))
			h.RequireClass(sagadef.ClassConflicting)
			h.RequireState(sagadef.StateManualReview)
			// Nothing was pending: retry has nothing to resend.
			_, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorRetry, Operator: "ops", Reason: "why"})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
			h.Resolve(sagadef.StateCompleted, "shipping confirmed")
			h.RequireState(sagadef.StateCompleted)
		}},
		{"invalid messages change nothing", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			v := h.Instance().Version
			h.Reply(msg(unknownMessage)) // not part of the definition
			h.RequireClass(sagadef.ClassInvalid)
			h.Reply(msg(pPlaceOrder))
			h.RequireClass(sagadef.ClassDuplicate)
			h.RequireState(sReserve)
			require.Equal(t, v, h.Instance().Version)
		}},
		{"misaddressed replies are refused, naming what their causation names", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			before := h.Instance()
			misaddressed := func(causation, reply string) *sagadef.CausationError {
				t.Helper()
				_, err := h.TryApply(sagadef.Trigger{Kind: reply, Message: msg(reply), MessageID: "m-" + causation, CausationID: causation})
				require.ErrorIs(t, err, sagadef.ErrMisaddressed)
				var ce *sagadef.CausationError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, before, h.Instance(), "nothing changed")
				return ce
			}
			ce := misaddressed("", pInventoryReserved)
			require.Equal(t, sagadef.CausationError{Reply: pInventoryReserved, Step: "ReserveInventory"}, *ce)
			require.Equal(t, "InventoryReserved carries no causation id; it answers the command of step ReserveInventory", ce.Error())
			ce = misaddressed("someone-elses-command", pInventoryReserved)
			require.Empty(t, ce.NamedStep)
			require.Equal(t, `InventoryReserved names causation "someone-elses-command", which is no command this saga sent; `+
				"it answers the command of step ReserveInventory", ce.Error())
			ce = misaddressed(reserve, pPaymentAuthorized) // a step whose command was never sent
			require.Equal(t, sagadef.CausationError{Reply: pPaymentAuthorized, Step: "AuthorizePayment", CausationID: reserve,
				NamedStep: "ReserveInventory"}, *ce)
			ce = misaddressed(reserve, pInventoryReleased) // a compensation never sent
			require.True(t, ce.Compensation)
			require.Equal(t, "the compensation of step ReserveInventory", ce.Expected())
			require.Equal(t, "ReserveInventory", ce.NamedStep)

			// Settled steps too: a misaddressed copy of the outcome is
			// neither a duplicate nor a conflict.
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
			release := h.Instance().PendingMessageID
			before = h.Instance()
			misaddressed("stray", pInventoryReserved)
			ce = misaddressed("stray", pInventoryFailed)
			require.Equal(t, "ReserveInventory", ce.Step)
			ce = misaddressed(reserve, pInventoryReleased) // the command's id on the compensation's reply
			require.False(t, ce.NamedCompensation)
			ce = misaddressed(release, pInventoryReserved) // the compensation's id on the command's reply
			require.True(t, ce.NamedCompensation)
			require.Equal(t, `InventoryReserved names causation "`+release+`", which is the compensation of step ReserveInventory; `+
				"it answers the command of step ReserveInventory", ce.Error())
			h.ReplyTo(reserve, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassDuplicate)
		}},
		{"compensation failure goes to manual review and retries on request", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
			first := h.Instance().PendingMessageID
			h.Reply(msg(pInventoryReleaseFailed))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateManualReview)
			require.Equal(t, sCompReserve, h.Instance().Progress.ReviewFrom)
			require.Contains(t, h.Instance().ReviewReason, "compensation of step ReserveInventory failed")
			require.Zero(t, h.LastSent(pReleaseInventory).OperatorRetry)
			h.Operator(sagadef.TriggerOperatorRetry, "warehouse back online")
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.NotEqual(t, first, h.Instance().PendingMessageID)
			require.Equal(t, 1, h.Instance().Attempt)
			// Retried after a recorded failure: the command says so, and so
			// do its resends, so an idempotent participant runs it again.
			require.Equal(t, 1, h.LastSent(pReleaseInventory).OperatorRetry)
			h.Timeout()
			require.Equal(t, 1, h.LastSent(pReleaseInventory).OperatorRetry)
			h.Reply(msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateFailed)
		}},
		{"operator compensate after a recorded compensation failure marks the resend as a retry", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
			h.Reply(msg(pInventoryReleaseFailed))
			h.RequireState(sagadef.StateManualReview)
			h.Operator(sagadef.TriggerOperatorCompensate, "warehouse back online")
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, 1, h.LastSent(pReleaseInventory).OperatorRetry)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
		}},
		{"compensation timeout resends then goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
			first := h.LastSent(pReleaseInventory)
			h.Timeout()
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			require.Equal(t, first.Message.IdempotencyKey(), h.LastSent(pReleaseInventory).Message.IdempotencyKey())
			h.Timeout()
			h.RequireSent(pReleaseInventory)
			require.Equal(t, 3, h.Instance().Attempt)
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "compensation of step ReserveInventory unanswered after 3 attempts")
			// The reply to the first attempt arrives in review: recorded, and
			// the operator's retry continues from it.
			h.ReplyTo(first.MessageID, msg(pInventoryReleased))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
			h.Operator(sagadef.TriggerOperatorRetry, "release confirmed")
			h.RequireState(sagadef.StateFailed)
		}},
		{"operator retry resends the pending command", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			first := h.Instance().PendingMessageID
			h.Operator(sagadef.TriggerOperatorRetry, "participant redeployed")
			h.RequireState(sReserve)
			h.RequireSent(pReserveInventory)
			require.Zero(t, h.LastSent(pReserveInventory).OperatorRetry, "no failure was recorded: the same command again")
			require.NotEqual(t, first, h.Instance().PendingMessageID)
			require.Contains(t, h.Last().Note, "by sagatest: participant redeployed")
			// The answer to the first attempt is late (policy: ignore).
			h.ReplyTo(first, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sReserve)
		}},
		{"operator compensate from a step and from review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			h.Operator(sagadef.TriggerOperatorCompensate, "customer withdrew")
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			_, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorCompensate, Operator: "ops", Reason: "again"})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
			h.Reply(msg(pInventoryReleaseFailed))
			h.RequireState(sagadef.StateManualReview)
			h.Operator(sagadef.TriggerOperatorCompensate, "try the release again")
			h.RequireState(sCompReserve)
			h.RequireSent(pReleaseInventory)
			h.Reply(msg(pInventoryReleased))
			h.RequireState(sagadef.StateFailed)
		}},
		{"operator resolve and its errors", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			_, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorResolve, Operator: "ops", Reason: "r", ResolveTo: sagadef.StateCompleted})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger, "resolve outside review")
			h.Timeout()
			h.Timeout()
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			_, err = h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorResolve, Operator: "ops", Reason: "r", ResolveTo: sShipping})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger, "resolve to a non-terminal state")
			_, err = h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorResolve, Operator: "ops", ResolveTo: sagadef.StateFailed})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger, "no reason")
			_, err = h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorRetry, Operator: "ops", Reason: "r", ResolveTo: sagadef.StateFailed})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger, "ResolveTo on retry")
			h.Resolve(sagadef.StateCompleted, "shipped by hand")
			h.RequireState(sagadef.StateCompleted)
			require.Equal(t, []string{"ScheduleShipping"}, h.Instance().Progress.Stopped)
			_, err = h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorCancel, Operator: "ops", Reason: "r"})
			require.ErrorIs(t, err, sagadef.ErrTerminal)
		}},
		{"operator cancel", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			reserve := h.Instance().PendingMessageID
			h.Operator(sagadef.TriggerOperatorCancel, "fraud")
			h.RequireState(sagadef.StateCancelled)
			h.RequireSent()
			require.True(t, h.Instance().TimeoutAt.IsZero())
			require.Equal(t, []string{"ReserveInventory"}, h.Instance().Progress.Stopped)
			for _, kind := range []string{sagadef.TriggerOperatorRetry, sagadef.TriggerOperatorCompensate, sagadef.TriggerOperatorCancel} {
				_, err := h.TryApply(sagadef.Trigger{Kind: kind, Operator: "ops", Reason: "r"})
				require.ErrorIs(t, err, sagadef.ErrTerminal, kind)
			}
			// Cancelled without compensation: a late reservation is not
			// covered, and the step's policy (ignore) applies.
			h.ReplyTo(reserve, msg(pInventoryReserved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateCancelled)
		}},
		{"operator triggers need operator and reason", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			_, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorCancel, Reason: "r"})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
			_, err = h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorCancel, Operator: "ops", Reason: "  "})
			require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
			h.RequireState(sReserve)
		}},
		{"deadline sends a waiting saga to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			// Not due yet: stale, nothing changes.
			v := h.Instance().Version
			res, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerDeadline})
			require.NoError(t, err)
			require.Equal(t, sagadef.ClassLate, res.Class)
			require.Equal(t, v, h.Instance().Version)
			h.Deadline()
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "deadline exceeded")
			require.True(t, h.Instance().DeadlineAt.IsZero(), "a deadline fires once")
			h.Operator(sagadef.TriggerOperatorRetry, "extend")
			h.RequireState(sAuthorize)
			h.RequireSent(pAuthorizePayment)
		}},
		{"stale timeout changes nothing", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			res, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerTimeout})
			require.NoError(t, err)
			require.Equal(t, sagadef.ClassLate, res.Class)
			require.Equal(t, int64(1), h.Instance().Version)
			h.RequireState(sReserve)
		}},
		{"retriable step failure goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			h.Reply(msg(pShippingRejected))
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "steps after the pivot must not fail")
			h.Operator(sagadef.TriggerOperatorRetry, "address fixed")
			h.RequireState(sShipping)
			h.RequireSent(pScheduleShipping)
			require.Empty(t, h.Instance().Progress.Outcomes["ScheduleShipping"])
			h.Reply(msg(pShippingScheduled))
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sApprove)
		}},
		{"approve order timeout goes to manual review", placeOrder, func(t *testing.T, h *sagatest.Harness) {
			toShipping(h)
			h.Reply(msg(pShippingScheduled))
			h.Timeout()
			h.RequireState(sagadef.StateManualReview)
			require.Contains(t, h.Instance().ReviewReason, "step ApproveOrder timed out")
		}},
		{"quote approval happy path", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.RequireState(sPrepare)
			h.Reply(msg(qQuotePrepared))
			h.RequireState(sAwait)
			h.RequireSent()
			require.Empty(t, h.Instance().PendingMessageID)
			require.Equal(t, h.Now().Add(72*time.Hour), h.Instance().TimeoutAt)
			h.Reply(msg(qQuoteApproved)) // an event: no causation needed
			h.RequireClass(sagadef.ClassNew)
			h.RequireState(sContract)
			h.RequireSent(qSendContract)
			h.Reply(msg(qContractSent))
			h.RequireState(sagadef.StateCompleted)
		}},
		{"quote rejected withdraws the quote", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Reply(msg(qQuotePrepared))
			h.Reply(msg(qQuoteRejected))
			h.RequireState(sCompPrepare)
			h.RequireSent(qWithdrawQuote)
			h.Reply(msg(qQuoteWithdrawn))
			h.RequireState(sagadef.StateFailed)
		}},
		{"approval timeout compensates; a late approval needs a human", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Reply(msg(qQuotePrepared))
			h.Timeout()
			h.RequireState(sCompPrepare)
			h.RequireSent(qWithdrawQuote)
			require.Equal(t, []string{"AwaitApproval"}, h.Instance().Progress.Stopped)
			h.Reply(msg(qQuoteApproved))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateManualReview)
		}},
		{"operator retry of an external step re-arms its timeout", quoteApproval, func(t *testing.T, h *sagatest.Harness) {
			h.Start(msg(qRequestQuote))
			h.Reply(msg(qQuotePrepared))
			h.Advance(time.Hour)
			h.Operator(sagadef.TriggerOperatorRetry, "remind approver")
			h.RequireState(sAwait)
			h.RequireSent()
			require.Equal(t, h.Now().Add(72*time.Hour), h.Instance().TimeoutAt)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sagatest.New(t, compiled(t, tt.def()), hooks())
			tt.run(t, h) // the harness checks purity and table membership of every step
		})
	}
}

func TestBeginErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := sagadef.Env{Now: sagatest.Epoch, NewID: func() string { return "id" }, Hooks: hooks()}

	_, err := placeOrder().Begin(ctx, env, "s1", msg(pPlaceOrder))
	require.ErrorIs(t, err, sagadef.ErrNotCompiled)

	d := compiled(t, placeOrder())
	_, err = d.Begin(ctx, env, "s1", msg(pInventoryReserved))
	require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
	_, err = d.Begin(ctx, env, "", msg(pPlaceOrder))
	require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
	_, err = d.Begin(ctx, env, "s1", nil)
	require.ErrorIs(t, err, sagadef.ErrInvalidTrigger)
	_, err = d.Begin(ctx, sagadef.Env{Now: sagatest.Epoch, NewID: env.NewID, Hooks: emptyKeyHooks{hooks()}}, "s1", msg(pPlaceOrder))
	require.ErrorContains(t, err, "business key is empty")
	_, err = d.Begin(ctx, sagadef.Env{Hooks: hooks()}, "s1", msg(pPlaceOrder))
	require.ErrorContains(t, err, "NewID")

	failing := sagadef.Env{Now: sagatest.Epoch, NewID: env.NewID, Hooks: sagatest.Hooks(types[pPlaceOrder])}
	_, err = d.Begin(ctx, failing, "s1", msg(pPlaceOrder))
	require.ErrorContains(t, err, "unknown command type "+pReserveInventory)
}

func TestApplyErrors(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder())
	h := sagatest.New(t, d, hooks())
	h.Start(msg(pPlaceOrder))
	inst := h.Instance()
	ctx := context.Background()

	_, err := placeOrder().Apply(ctx, h.Env(), inst, sagadef.Trigger{Kind: sagadef.TriggerTimeout})
	require.ErrorIs(t, err, sagadef.ErrNotCompiled)

	bad := inst
	bad.State = "REMOVED_STATE"
	_, err = d.Apply(ctx, h.Env(), bad, sagadef.Trigger{Kind: sagadef.TriggerTimeout})
	require.ErrorIs(t, err, sagadef.ErrUnknownState)

	for name, trig := range map[string]sagadef.Trigger{
		"kind and message disagree":       {Kind: pInventoryFailed, Message: msg(pInventoryReserved), CausationID: inst.PendingMessageID},
		"message trigger without message": {Kind: pInventoryReserved, CausationID: inst.PendingMessageID},
		"start":                           {Kind: sagadef.TriggerStart},
		"empty":                           {},
		"nil info":                        {Message: &sagatest.Message{}},
	} {
		_, err := d.Apply(ctx, h.Env(), inst, trig)
		require.ErrorIs(t, err, sagadef.ErrInvalidTrigger, name)
	}
	_, err = d.Apply(ctx, sagadef.Env{NewID: h.NewID}, inst, sagadef.Trigger{Kind: sagadef.TriggerTimeout})
	require.ErrorContains(t, err, "Hooks is nil")

	hookErr := errors.New("boom")
	_, err = d.Apply(ctx, sagadef.Env{Now: h.Now(), NewID: h.NewID, Hooks: failingHooks{hooks(), hookErr}}, inst,
		sagadef.Trigger{Kind: pInventoryReserved, Message: msg(pInventoryReserved), CausationID: inst.PendingMessageID})
	require.ErrorIs(t, err, hookErr)
}

// failingHooks fails every Apply.
type failingHooks struct {
	sagadef.Hooks
	err error
}

func (f failingHooks) Apply(context.Context, proto.Message, message.Message) error { return f.err }

// withLate returns a Place Order constructor with the late policy of step
// set to p.
func withLate(step string, p sagadef.LatePolicy) func(...func(*sagadef.Definition)) *sagadef.Definition {
	return func(mods ...func(*sagadef.Definition)) *sagadef.Definition {
		return placeOrder(append(mods, late(step, p))...)
	}
}

// emptyKeyHooks returns an empty business key.
type emptyKeyHooks struct{ sagadef.Hooks }

func (h emptyKeyHooks) Start(ctx context.Context, start message.Message) (proto.Message, string, error) {
	data, _, err := h.Hooks.Start(ctx, start)
	return data, "", err
}
