package sagadef_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

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
