package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

// TestLateReplyAfterTimeout lets the payment step time out (the saga starts
// compensating) and then delivers the payment's success reply, under each
// late-reply policy.
func TestLateReplyAfterTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy    sagadef.LatePolicy
		wantState string
	}{
		{sagadef.LateIgnore, stCompReserve},
		{sagadef.LateManualReview, stManualReview},
		{sagadef.LateApplyIfWaiting, stCompReserve}, // no longer waiting: ignored
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, defOptions{late: tc.policy})
			id := b.start(t, "order-1")
			b.mustReply(t, id, msgInventoryReserved)
			paymentCmd := b.status(t, id).PendingMessageID

			b.clock.Advance(stepTimeout)
			require.Equal(t, 1, b.fire(t))
			timedOut := b.status(t, id)
			require.Equal(t, stCompReserve, timedOut.State, "a payment timeout compensates")
			require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)))

			lateID, err := b.reply(t, id, msg(msgPaymentAuthorized, "order-1"), paymentCmd)
			require.NoError(t, err, "a late reply is acked")
			st := b.status(t, id)
			require.Equal(t, tc.wantState, st.State)
			if tc.wantState == timedOut.State {
				require.Equal(t, timedOut.Version, st.Version, "an ignored late reply changes nothing")
			} else {
				require.Equal(t, timedOut.Version+1, st.Version)
				require.NotEmpty(t, st.ReviewReason)
			}
			require.Len(t, b.outbox(t, id), 3, "a late reply sends nothing")
			h := b.history(t, id)
			last := h[len(h)-1]
			require.Equal(t, sagadef.ClassLate.String(), last.Class)
			require.Equal(t, lateID, last.MessageID)
			require.Equal(t, paymentCmd, last.CausationID)
			require.Equal(t, msgPaymentAuthorized.FullName, last.Trigger)
		})
	}
}

// TestLateReplyToEarlierAttempt lets the shipping step time out and resend
// its command, then delivers the answer to the first attempt.
func TestLateReplyToEarlierAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy    sagadef.LatePolicy
		wantState string
	}{
		{sagadef.LateIgnore, stShipping},
		{sagadef.LateManualReview, stManualReview},
		{sagadef.LateApplyIfWaiting, stCompleted}, // still waiting on the step: applied
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, defOptions{late: tc.policy, shippingMax: 3})
			id := b.toShipping(t, "order-1")
			firstCmd := b.status(t, id).PendingMessageID
			b.clock.Advance(stepTimeout)
			require.Equal(t, 1, b.fire(t))
			resent := b.status(t, id)
			require.Equal(t, 2, resent.Attempt)

			_, err := b.reply(t, id, msg(msgShippingScheduled, "order-1"), firstCmd)
			require.NoError(t, err)
			st := b.status(t, id)
			require.Equal(t, tc.wantState, st.State)
			h := b.history(t, id)
			require.Equal(t, sagadef.ClassLate.String(), h[len(h)-1].Class)
		})
	}
}
