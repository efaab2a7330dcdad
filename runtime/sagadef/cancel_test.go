package sagadef_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// cancelMsg returns a cancel message whose one field names who asked and why.
func cancelMsg(name, byAndWhy string) message.Message {
	return sagatest.NewMessage(types[name], byAndWhy)
}

// TestCancelCompensates: a business cancel before the pivot completed stops
// the current step, compensates the completed compensatable steps in reverse
// order and ends CANCELLED, not FAILED; the instance records who asked and why.
func TestCancelCompensates(t *testing.T) {
	t.Parallel()
	t.Run("waiting on a compensatable step", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, placeOrder(cancellable), hooks())
		h.Start(msg(pPlaceOrder))
		reserve := h.Instance().PendingMessageID
		res := h.Cancel(cancelMsg(pCancelOrder, "alice"))
		h.RequireClass(sagadef.ClassNew)
		// The step it stopped may have taken effect: it is compensated.
		h.RequireState(sCompReserve)
		h.RequireSent(pReleaseInventory)
		require.Equal(t, &sagadef.Cancellation{RequestedBy: "alice", Reason: "alice", MessageID: res.Instance.Progress.Cancel.MessageID},
			res.Instance.Progress.Cancel)
		require.NotEmpty(t, res.Instance.Progress.Cancel.MessageID)
		require.Contains(t, res.Note, "cancel requested by alice (alice) while waiting on step ReserveInventory; compensating")
		require.Equal(t, []string{"ReserveInventory"}, res.Instance.Progress.Stopped)
		require.Contains(t, sagatest.Applied(res.Instance.Data), pCancelOrder, "the cancel is folded into the saga data")

		h.Reply(msg(pInventoryReleased))
		h.RequireState(sagadef.StateCancelled)
		require.True(t, h.Instance().TimeoutAt.IsZero())
		require.True(t, h.Instance().DeadlineAt.IsZero())
		require.Empty(t, h.Instance().LastError, "a cancel is no error")

		h.ReplyTo(reserve, msg(pInventoryReserved)) // the stopped step answers after all
		h.RequireClass(sagadef.ClassLate)
		h.RequireState(sagadef.StateCancelled)
	})
	t.Run("waiting on the pivot", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, placeOrder(cancellable), hooks())
		h.Start(msg(pPlaceOrder))
		h.Reply(msg(pInventoryReserved))
		h.RequireState(sAuthorize)
		payment := h.Instance().PendingMessageID
		h.Cancel(cancelMsg(pCancelOrder, "bob"))
		h.RequireState(sCompReserve)
		h.RequireSent(pReleaseInventory)
		h.Reply(msg(pInventoryReleased))
		h.RequireState(sagadef.StateCancelled)
		// The payment was authorized after all: the pivot's late-reply
		// policy (manual review) asks a human to refund.
		h.ReplyTo(payment, msg(pPaymentAuthorized))
		h.RequireState(sagadef.StateManualReview)
	})
	t.Run("nothing to compensate", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, quoteApproval(cancellable, func(d *sagadef.Definition) {
			d.Steps = d.Steps[1:] // the approval (pivot) first
		}), hooks())
		h.Start(msg(qRequestQuote))
		h.RequireState(sAwait)
		h.Cancel(cancelMsg(qQuoteCancelled, "carol"))
		h.RequireState(sagadef.StateCancelled)
		h.RequireSent()
	})
	t.Run("an external pivot", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, quoteApproval(cancellable), hooks())
		h.Start(msg(qRequestQuote))
		h.Reply(msg(qQuotePrepared))
		h.RequireState(sAwait)
		h.Cancel(cancelMsg(qQuoteCancelled, "dave"))
		h.RequireState(sCompPrepare)
		h.RequireSent(qWithdrawQuote)
		h.Reply(msg(qQuoteWithdrawn))
		h.RequireState(sagadef.StateCancelled)
	})
	t.Run("a failed compensation resumed by an operator still ends cancelled", func(t *testing.T) {
		t.Parallel()
		h := sagatest.New(t, placeOrder(cancellable), hooks())
		h.Start(msg(pPlaceOrder))
		h.Reply(msg(pInventoryReserved))
		h.Cancel(cancelMsg(pCancelOrder, "erin"))
		for range 3 { // the release is sent MaxAttempts times, then review
			h.Timeout()
		}
		h.RequireState(sagadef.StateManualReview)
		h.OperatorRetry("warehouse back")
		h.RequireState(sCompReserve)
		h.Reply(msg(pInventoryReleased))
		h.RequireState(sagadef.StateCancelled)
	})
}

// TestCancelRefusedOrIgnored: past the point of no return the cancel is
// refused; while compensating and after the end it changes nothing. Each is classified late, keeps the version, and says
// why in the note.
func TestCancelRefusedOrIgnored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(h *sagatest.Harness)
		state string
		note  string
	}{
		{"after the pivot", func(h *sagatest.Harness) { toShipping(h) }, sShipping,
			"cancel requested by frank (frank) refused: pivot step AuthorizePayment completed, past the point of no return; the saga runs to completion"},
		{"while compensating", func(h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryReserved))
			h.Reply(msg(pPaymentDeclined))
		}, sCompReserve, "ignored: the saga is already compensating (step ReserveInventory)"},
		{"after the end", func(h *sagatest.Harness) {
			h.Start(msg(pPlaceOrder))
			h.Reply(msg(pInventoryFailed))
		}, sagadef.StateFailed, "ignored: the saga already ended FAILED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := sagatest.New(t, placeOrder(cancellable), hooks())
			tc.setup(h)
			h.RequireState(tc.state)
			before := h.Instance()
			res := h.Cancel(cancelMsg(pCancelOrder, "frank"))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(tc.state)
			h.RequireSent()
			require.Contains(t, res.Note, tc.note)
			require.Equal(t, before.Version, res.Instance.Version)
			require.Nil(t, res.Instance.Progress.Cancel)
			require.False(t, res.IsTransition())
		})
	}
}

// TestCancelInReviewIsRecorded: in manual review a cancel changes no
// state but is recorded for the operator (a late class, a new version, no
// command sent); a second one is ignored; a compensation the operator then
// starts ends CANCELLED. An operator's retry drops the request.
func TestCancelInReviewIsRecorded(t *testing.T) {
	t.Parallel()
	toReview := func(h *sagatest.Harness) {
		h.Start(msg(pPlaceOrder))
		h.Reply(msg(pInventoryReserved))
		h.Reply(msg(pPaymentAuthorized))
		h.Reply(msg(pShippingRejected))
		h.RequireState(sagadef.StateManualReview)
	}
	h := sagatest.New(t, placeOrder(cancellable), hooks())
	toReview(h)
	before := h.Instance()
	res := h.Cancel(cancelMsg(pCancelOrder, "frank"))
	h.RequireClass(sagadef.ClassLate)
	h.RequireState(sagadef.StateManualReview)
	h.RequireSent()
	require.False(t, res.IsTransition())
	require.Equal(t, before.Version+1, res.Instance.Version, "the record is a write")
	require.NotNil(t, res.Instance.Progress.Cancel)
	require.Equal(t, "frank", res.Instance.Progress.Cancel.RequestedBy)
	require.NotEmpty(t, res.Instance.Progress.Cancel.MessageID)
	require.Contains(t, res.Note, "cancel requested by frank (frank) while the saga is in manual review: recorded, the state unchanged")

	res = h.Cancel(cancelMsg(pCancelOrder, "grace"))
	h.RequireClass(sagadef.ClassLate)
	require.Contains(t, res.Note, "ignored: the saga in manual review already holds the cancel requested by frank (frank)")
	require.Equal(t, "frank", res.Instance.Progress.Cancel.RequestedBy)

	h.OperatorCompensate("customer asked to cancel")
	h.RequireState(sCompReserve)
	h.Reply(msg(pInventoryReleased))
	h.RequireState(sagadef.StateCancelled)

	h = sagatest.New(t, placeOrder(cancellable), hooks())
	toReview(h)
	h.Cancel(cancelMsg(pCancelOrder, "frank"))
	h.OperatorRetry("the carrier takes it after all")
	require.Nil(t, h.Instance().Progress.Cancel, "going forward drops the request")
}

// TestCancelRequester: who and why come from the message's fields, unless
// the trigger names them (the engine fills them for the audit trail).
func TestCancelRequester(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(cancellable))
	by, why := d.CancelRequest(cancelMsg(pCancelOrder, " grace "))
	require.Equal(t, "grace", by)
	require.Equal(t, "grace", why)
	by, why = d.CancelRequest(nil)
	require.Empty(t, by)
	require.Empty(t, why)

	other := compiled(t, placeOrder(func(d *sagadef.Definition) {
		d.Cancel = sagadef.Cancel{Message: pCancelOrder, RequestedBy: "nope", Reason: "value.deeper"}
	}))
	by, why = other.CancelRequest(cancelMsg(pCancelOrder, "x"))
	require.Empty(t, by, "an unknown field names nobody")
	require.Empty(t, why, "a path through a scalar names nothing")

	h := sagatest.New(t, placeOrder(cancellable), hooks())
	h.Start(msg(pPlaceOrder))
	m := cancelMsg(pCancelOrder, "from-the-message")
	res, err := h.TryApply(sagadef.Trigger{Kind: pCancelOrder, Message: m, Operator: "heidi", Reason: "customer called"})
	require.NoError(t, err)
	require.Equal(t, "heidi", res.Instance.Progress.Cancel.RequestedBy)
	require.Equal(t, "customer called", res.Instance.Progress.Cancel.Reason)

	empty := sagatest.New(t, placeOrder(cancellable), hooks())
	empty.Start(msg(pPlaceOrder))
	res = empty.Cancel(cancelMsg(pCancelOrder, ""))
	require.Contains(t, res.Note, "cancel requested by (not given) ((not given))")
	empty.RequireState(sCompReserve)
}

// TestCancelTable: the table holds the cancel's rows, and only where a
// cancel applies.
func TestCancelTable(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(cancellable))
	rows := map[string][]string{}
	for _, tr := range d.Transitions {
		if tr.Trigger == pCancelOrder {
			rows[tr.From] = append(rows[tr.From], tr.To)
		}
	}
	require.Equal(t, map[string][]string{sReserve: {sCompReserve}, sAuthorize: {sCompReserve}}, rows)
	require.Contains(t, d.Transitions, sagadef.Transition{From: sCompReserve, Trigger: pInventoryReleased, To: sagadef.StateCancelled})
	require.Contains(t, d.Transitions, sagadef.Transition{From: sCompReserve, Trigger: pInventoryReleased, To: sagadef.StateFailed})
	ref, ok := d.Lookup(pCancelOrder)
	require.True(t, ok)
	require.Equal(t, sagadef.MessageRef{Use: sagadef.UseCancel}, ref)
	require.Contains(t, d.Mermaid(), "RESERVE_INVENTORY --> COMPENSATING_RESERVE_INVENTORY : ")
	require.Contains(t, d.Mermaid(), "CancelOrder / ReleaseInventory")

	plain := compiled(t, placeOrder())
	for _, tr := range plain.Transitions {
		require.NotEqual(t, pCancelOrder, tr.Trigger)
	}
	require.Less(t, len(plain.Transitions), len(d.Transitions))
}

func TestCancelCompileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cancel sagadef.Cancel
		want   string
	}{
		{"a step's reply", sagadef.Cancel{Message: pPaymentDeclined},
			"cancel message shop.v1.PaymentDeclined is already the failure reply of step AuthorizePayment"},
		{"the start message", sagadef.Cancel{Message: pPlaceOrder}, "cancel message shop.v1.PlaceOrder is already the start message"},
		{"not a full name", sagadef.Cancel{Message: "shop..Cancel"}, `cancel message "shop..Cancel" is not a valid proto full name`},
		{"fields without a message", sagadef.Cancel{RequestedBy: "by"}, `cancel names fields (requested by "by", reason "") but no cancel message`},
		{"bad field path", sagadef.Cancel{Message: pCancelOrder, Reason: "why."}, `cancel reason field path "why." is not proto field names joined with dots`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := placeOrder(func(d *sagadef.Definition) { d.Cancel = tc.cancel })
			err := d.Compile()
			require.ErrorIs(t, err, sagadef.ErrInvalidDefinition)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestCancelPurity: a cancel leaves its input instance untouched (the
// harness checks every Apply) and a no-op returns the input as it is.
func TestCancelPurity(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(cancellable))
	env := sagadef.Env{Now: sagatest.Epoch, NewID: func() string { return "id-1" }, Hooks: hooks()}
	begun, err := d.Begin(context.Background(), env, "saga-1", msg(pPlaceOrder))
	require.NoError(t, err)
	env.NewID = func() string { return "id-2" }
	res, err := d.Apply(context.Background(), env, begun.Instance, sagadef.Trigger{Kind: pCancelOrder, Message: cancelMsg(pCancelOrder, "ivan")})
	require.NoError(t, err)
	require.Nil(t, begun.Instance.Progress.Cancel)
	require.Equal(t, begun.Instance.Version+1, res.Instance.Version)
	require.Equal(t, sCompReserve, res.To)
}
