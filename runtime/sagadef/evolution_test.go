package sagadef_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// TestEvolutionReorderedSteps: an instance persisted by one release and
// continued by a release whose definition orders two retriable steps the
// other way round never sends a step it already completed again (its
// reply would be a duplicate of the recorded outcome, and the saga would
// wait for nothing until its timeout).
func TestEvolutionReorderedSteps(t *testing.T) {
	t.Parallel()
	old := sagatest.New(t, compiled(t, placeOrder()), hooks())
	toShipping(old)
	old.Reply(msg(pShippingScheduled))
	old.RequireState(sApprove)

	next := compiled(t, placeOrder(func(d *sagadef.Definition) {
		d.Steps[2], d.Steps[3] = d.Steps[3], d.Steps[2]
	}))
	n := 0
	env := sagadef.Env{Now: old.Now(), Hooks: hooks(), NewID: func() string { n++; return fmt.Sprintf("next-%d", n) }}
	inst := old.Instance()
	res, err := next.Apply(context.Background(), env, inst, sagadef.Trigger{Kind: pOrderApproved,
		Message: msg(pOrderApproved), MessageID: "reply-1", CausationID: inst.PendingMessageID})
	require.NoError(t, err)
	require.Equal(t, sagadef.ClassNew, res.Class)
	require.Empty(t, res.Emit, "ScheduleShipping completed under the old order")
	require.Equal(t, sagadef.StateCompleted, res.To)
}

const (
	hHold   = "shop.v1.Hold"
	hHeld   = "shop.v1.Held"
	hUnhold = "shop.v1.Unhold"
	hUnheld = "shop.v1.Unheld"
)

func init() {
	types[hHold] = sagatest.NewType(hHold, message.KindCommand)
	types[hUnhold] = sagatest.NewType(hUnhold, message.KindCommand)
	types[hHeld] = sagatest.NewType(hHeld, message.KindReply)
	types[hUnheld] = sagatest.NewType(hUnheld, message.KindReply)
}

// withHold adds a second compensatable step, Hold, after ReserveInventory
// (or before it, first).
func withHold(first bool) func(*sagadef.Definition) {
	return func(d *sagadef.Definition) {
		hold := sagadef.Step{Name: "Hold", Role: sagadef.RoleCompensatable, Command: hHold, SuccessReplies: []string{hHeld},
			Compensation: hUnhold, CompensationReply: hUnheld, Timeout: 30 * time.Second, OnTimeout: sagadef.TimeoutCompensate,
			MaxAttempts: 1, Late: sagadef.LateIgnore}
		if first {
			d.Steps = append([]sagadef.Step{hold}, d.Steps...)
		} else {
			d.Steps = append([]sagadef.Step{d.Steps[0], hold}, d.Steps[1:]...)
		}
	}
}

// TestEvolutionReorderedCompensation: an instance that completed
// ReserveInventory, then Hold, under one release and fails under a release
// that orders Hold first compensates in reverse of the order its steps ran:
// Hold first (PRODUCT §4.7), then ReserveInventory.
func TestEvolutionReorderedCompensation(t *testing.T) {
	t.Parallel()
	old := sagatest.New(t, compiled(t, placeOrder(withHold(false))), hooks())
	old.Start(msg(pPlaceOrder))
	old.Reply(msg(pInventoryReserved))
	old.Reply(msg(hHeld))
	old.RequireState(sAuthorize)

	next := compiled(t, placeOrder(withHold(true)))
	n := 0
	env := sagadef.Env{Now: old.Now(), Hooks: hooks(), NewID: func() string { n++; return fmt.Sprintf("next-%d", n) }}
	inst := old.Instance()
	res, err := next.Apply(context.Background(), env, inst, sagadef.Trigger{Kind: pPaymentDeclined,
		Message: msg(pPaymentDeclined), MessageID: "reply-1", CausationID: inst.PendingMessageID})
	require.NoError(t, err)
	require.Equal(t, sagadef.CompensatingStateName("Hold"), res.To, "the step that ran last is compensated first")
	require.Len(t, res.Emit, 1)
	require.Equal(t, hUnhold, res.Emit[0].Message.SagaMessageInfo().FullName)

	inst = res.Instance
	res, err = next.Apply(context.Background(), env, inst, sagadef.Trigger{Kind: hUnheld,
		Message: msg(hUnheld), MessageID: "reply-2", CausationID: res.Emit[0].MessageID})
	require.NoError(t, err)
	require.Equal(t, sagadef.CompensatingStateName("ReserveInventory"), res.To)
}
