package saga_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
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

// TestLateReplyOfACompensatedStep lets the reservation time out; its
// compensation (sent naming the reservation command) is confirmed and the
// saga fails. Then the reservation's success arrives: an effect the saga no
// longer counts on. Manual review asks a human to check that the release
// undid it; ignore and apply if waiting audit it, naming the compensation.
func TestLateReplyOfACompensatedStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy    sagadef.LatePolicy
		wantState string
	}{
		{sagadef.LateIgnore, stFailed},
		{sagadef.LateManualReview, stManualReview},
		{sagadef.LateApplyIfWaiting, stFailed},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, defOptions{late: tc.policy})
			id := b.start(t, "order-1")
			reserveCmd := b.status(t, id).PendingMessageID
			b.clock.Advance(stepTimeout)
			require.Equal(t, 1, b.fire(t))
			require.Equal(t, stCompReserve, b.status(t, id).State)
			failed := b.mustReply(t, id, msgInventoryReleased)
			require.Equal(t, stFailed, failed.State)

			_, err := b.reply(t, id, msg(msgInventoryReserved, "order-1"), reserveCmd)
			require.NoError(t, err)
			st := b.status(t, id)
			require.Equal(t, tc.wantState, st.State)
			h := b.history(t, id)
			last := h[len(h)-1]
			require.Equal(t, sagadef.ClassLate.String(), last.Class)
			if tc.wantState == stFailed {
				require.Equal(t, failed.Version, st.Version, "audited only")
				require.Contains(t, last.Note, "its compensation ReleaseInventory was sent naming the command")
			} else {
				require.Contains(t, st.ReviewReason, "late InventoryReserved for step ReserveInventory")
				require.Contains(t, st.ReviewReason, "check that its compensation ReleaseInventory undid it")
			}
			require.Len(t, b.outbox(t, id), 2, "a late reply sends nothing")
		})
	}
}

// TestLateSuccessAfterCompensation: the same late reservation, from a
// participant that runs each command once and records it as done when its
// compensation comes first (x-saga-once, as every host-registered
// participant sends): its effect was in place before the release ran, which
// undid it, so it is audited under every policy, manual review included.
// Without the header the policy decides (TestLateReplyOfACompensatedStep).
func TestLateSuccessAfterCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{late: sagadef.LateManualReview})
	id := b.start(t, "order-1")
	reserveCmd := b.status(t, id).PendingMessageID
	b.clock.Advance(stepTimeout)
	require.Equal(t, 1, b.fire(t))
	failed := b.mustReply(t, id, msgInventoryReleased)
	require.Equal(t, stFailed, failed.State)

	_, err := b.replyWith(t, id, msg(msgInventoryReserved, "order-1"), reserveCmd, map[string]any{message.HeaderOnce: "inventory"})
	require.NoError(t, err)
	st := b.status(t, id)
	require.Equal(t, stFailed, st.State)
	require.Equal(t, failed.Version, st.Version, "audited only")
	h := b.history(t, id)
	require.Contains(t, h[len(h)-1].Note, "the compensation, sent after this attempt, undid its effect")
}

// TestLateCompensationReplyToEarlierAttempt lets the release of a timed-out
// reservation time out too, so it is sent again; the first release's
// confirmation then arrives while the saga waits for the second. Every
// attempt sends the same compensating command, so the compensation is done
// under every policy: the saga fails, and the second confirmation is a
// duplicate.
func TestLateCompensationReplyToEarlierAttempt(t *testing.T) {
	t.Parallel()
	for _, policy := range []sagadef.LatePolicy{sagadef.LateIgnore, sagadef.LateManualReview, sagadef.LateApplyIfWaiting} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, defOptions{late: policy, reserveMax: 2})
			id := b.start(t, "order-1")
			b.clock.Advance(stepTimeout)
			require.Equal(t, 1, b.fire(t))
			firstRelease := b.status(t, id).PendingMessageID
			b.clock.Advance(stepTimeout)
			require.Equal(t, 1, b.fire(t))
			resent := b.status(t, id)
			require.Equal(t, stCompReserve, resent.State)
			require.Equal(t, 2, resent.Attempt)

			_, err := b.reply(t, id, msg(msgInventoryReleased, "order-1"), firstRelease)
			require.NoError(t, err)
			require.Equal(t, stFailed, b.status(t, id).State)
			_, err = b.reply(t, id, msg(msgInventoryReleased, "order-1"), resent.PendingMessageID)
			require.NoError(t, err)
			h := b.history(t, id)
			require.Equal(t, []string{"InventoryReleased:late:" + stCompReserve + ">" + stFailed, "InventoryReleased:duplicate:" + stFailed + ">" + stFailed},
				trail(h[len(h)-2:]))
		})
	}
}
