package sagadef_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// Outcome replies of the child fixture.
const (
	cCompleted = "shop.v1.ReservationCompleted"
	cFailed    = "shop.v1.ReservationFailed"
	cCancelled = "shop.v1.ReservationCancelled"
)

// asChild makes Place Order a child saga: it declares its outcome replies.
func asChild(d *sagadef.Definition) {
	d.Replies = sagadef.Replies{Completed: cCompleted, Failed: cFailed, Cancelled: cCancelled}
}

// reserveOnly keeps Place Order's first step (compensatable) and adds a
// check step after it: a child with nothing irreversible.
func reserveOnly(d *sagadef.Definition) {
	checked(d)
	d.Steps = d.Steps[:3] // ValidateOrder (check), ReserveInventory, AwaitFraudClearance (check)
}

// TestChildCancelAfterCompletion: a saga that declares a cancelled reply
// and completed without passing a point of no return is compensated by a
// cancel that finds it COMPLETED (a parent compensating its child step),
// in reverse, passing over check steps, and ends CANCELLED; a second cancel
// changes nothing.
func TestChildCancelAfterCompletion(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, placeOrder(cancellable, reserveOnly, asChild), hooks())
	h.Start(msg(pPlaceOrder))
	h.Reply(msg(pOrderValid))
	h.Reply(msg(pInventoryReserved))
	h.Reply(msg(pFraudCleared))
	h.RequireState(sagadef.StateCompleted)

	res := h.Cancel(cancelMsg(pCancelOrder, "parent"))
	h.RequireClass(sagadef.ClassNew)
	h.RequireState(sagadef.CompensatingStateName("ReserveInventory"))
	h.RequireSent(pReleaseInventory)
	require.Contains(t, res.Note, "after the saga completed; compensating its steps in reverse")
	require.Equal(t, res.Instance.Progress.Cancel.MessageID, h.Instance().Progress.Cancel.MessageID)
	h.Reply(msg(pInventoryReleased))
	h.RequireState(sagadef.StateCancelled)

	h.Cancel(cancelMsg(pCancelOrder, "parent again"))
	h.RequireClass(sagadef.ClassLate)
	h.RequireState(sagadef.StateCancelled)
	h.RequireSent()
}

// TestChildCancelAfterPointOfNoReturn: a completed saga whose pivot
// completed is not compensated by a cancel, replies declared or not; nor is
// a completed saga that declares no cancelled reply.
func TestChildCancelAfterPointOfNoReturn(t *testing.T) {
	t.Parallel()
	for name, d := range map[string]*sagadef.Definition{
		"pivot completed":    placeOrder(cancellable, asChild),
		"no replies":         placeOrder(cancellable, reserveOnly),
		"replies, no cancel": placeOrder(cancellable, reserveOnly, asChild),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name == "replies, no cancel" {
				// Declared without the cancelled reply, a child is not
				// compensable after completion; Compile requires the
				// reply with a cancel, so drop both.
				d.Replies.Cancelled = ""
				d.Cancel = sagadef.Cancel{}
			}
			h := sagatest.New(t, d, hooks())
			h.Start(msg(pPlaceOrder))
			for h.Instance().State != sagadef.StateCompleted {
				st, _ := d.LookupState(h.Instance().State)
				step, _ := d.LookupStep(st.Step)
				if step.External {
					h.Reply(msg(step.SuccessReplies[0]))
				} else {
					h.Reply(msg(step.SuccessReplies[0]))
				}
			}
			if d.Cancel.Message == "" {
				return
			}
			h.Cancel(cancelMsg(pCancelOrder, "parent"))
			h.RequireClass(sagadef.ClassLate)
			h.RequireState(sagadef.StateCompleted)
			h.RequireSent()
		})
	}
}

// TestChildTable: the transition table lists the compensation a cancel
// starts from COMPLETED.
func TestChildTable(t *testing.T) {
	t.Parallel()
	d := compiled(t, placeOrder(cancellable, reserveOnly, asChild))
	require.Contains(t, d.Transitions, sagadef.Transition{
		From: sagadef.StateCompleted, Trigger: pCancelOrder, To: sagadef.CompensatingStateName("ReserveInventory"),
		Emits: []string{pReleaseInventory},
	})
	plain := compiled(t, placeOrder(cancellable, reserveOnly))
	for _, tr := range plain.Transitions {
		if tr.From == sagadef.StateCompleted {
			require.NotEqual(t, pCancelOrder, tr.Trigger, "a saga that is no child is never compensated after completion")
		}
	}
}

// TestChildRepliesCompile: Compile refuses replies without a completed or
// failed reply, a cancelled reply without a cancel (and the reverse), and
// one reply for two outcomes.
func TestChildRepliesCompile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mod  func(*sagadef.Definition)
		want string
	}{
		{"no completed", func(d *sagadef.Definition) { d.Replies.Completed = "" }, "replies name no completed reply"},
		{"no failed", func(d *sagadef.Definition) { d.Replies.Failed = "" }, "replies name no failed reply"},
		{"no cancelled", func(d *sagadef.Definition) { d.Replies.Cancelled = "" }, "replies name no cancelled reply, but the saga declares cancel"},
		{"no cancel", func(d *sagadef.Definition) { d.Cancel = sagadef.Cancel{} }, "replies name a cancelled reply, but the saga declares no cancel"},
		{"one reply twice", func(d *sagadef.Definition) { d.Replies.Failed = cCompleted }, "names two outcomes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := placeOrder(cancellable, reserveOnly, asChild, c.mod)
			require.ErrorContains(t, d.Compile(), c.want)
		})
	}
	require.Equal(t, cCancelled, sagadef.Replies{Cancelled: cCancelled}.For(sagadef.StateCancelled))
	require.Empty(t, sagadef.Replies{Completed: cCompleted}.For(sagadef.StateManualReview))
	require.Empty(t, sagadef.Replies{Completed: cCompleted}.For("RESERVE_INVENTORY"))
}

// TestChildParentKept: the parent an instance records travels through
// every transition unchanged, and Apply never shares it with its input.
func TestChildParentKept(t *testing.T) {
	t.Parallel()
	d := placeOrder(cancellable, reserveOnly, asChild)
	h := sagatest.New(t, d, hooks())
	h.Start(msg(pPlaceOrder))
	in := h.Instance()
	parent := &sagadef.Parent{SagaType: "trip.v1.Trip", SagaID: "trip-1", StartMessageID: "m-1"}
	in.Progress.Parent = parent
	res, err := d.Apply(context.Background(), h.Env(), in, sagadef.Trigger{
		Kind: pOrderValid, Message: msg(pOrderValid), MessageID: "r-1", CausationID: in.PendingMessageID,
	})
	require.NoError(t, err)
	require.Equal(t, parent, res.Instance.Progress.Parent)
	require.NotSame(t, parent, res.Instance.Progress.Parent)
}

// TestChildReviewRecorded: a child's manual-review reply, while the parent
// waits on the child step, is recorded with the child's reason, the state
// unchanged (class late: no transition); the record goes when the step
// settles. For a step the saga no longer waits on it is only audited.
func TestChildReviewRecorded(t *testing.T) {
	t.Parallel()
	review := unknownMessage // a reply no other step uses
	d := placeOrder(func(d *sagadef.Definition) {
		d.Steps[0].Child, d.Steps[0].ChildReview = "pay.v1.Payment", review
	})
	h := sagatest.New(t, d, hooks())
	h.Start(msg(pPlaceOrder))
	in := h.Instance()
	res, err := d.Apply(context.Background(), h.Env(), in, sagadef.Trigger{
		Kind: review, Message: msg(review), MessageID: "r-1", CausationID: in.PendingMessageID,
		Reason: "pay.v1.Payment 42 (business key order-1): card issuer unreachable",
	})
	require.NoError(t, err)
	require.Equal(t, sagadef.ClassLate, res.Class)
	require.False(t, res.IsTransition())
	require.Equal(t, in.State, res.Instance.State)
	require.Equal(t, &sagadef.ChildReview{Step: "ReserveInventory", Reason: "pay.v1.Payment 42 (business key order-1): card issuer unreachable"},
		res.Instance.Progress.ChildReview)
	require.Contains(t, res.Note, "child Payment of step ReserveInventory in manual review: pay.v1.Payment 42")

	in = res.Instance
	res, err = d.Apply(context.Background(), h.Env(), in, sagadef.Trigger{
		Kind: pInventoryReserved, Message: msg(pInventoryReserved), MessageID: "r-2", CausationID: in.PendingMessageID,
	})
	require.NoError(t, err)
	require.Equal(t, "AUTHORIZE_PAYMENT", res.Instance.State)
	require.Nil(t, res.Instance.Progress.ChildReview, "the step settled: the record goes")

	in = res.Instance
	res, err = d.Apply(context.Background(), h.Env(), in, sagadef.Trigger{
		Kind: review, Message: msg(review), MessageID: "r-3", CausationID: "somewhere", Reason: "again",
	})
	require.NoError(t, err)
	require.Equal(t, sagadef.ClassLate, res.Class)
	require.Nil(t, res.Instance.Progress.ChildReview)
	require.Contains(t, res.Note, "the saga does not wait on it")
}
