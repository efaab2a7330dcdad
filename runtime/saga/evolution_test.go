package saga_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// evolve returns a compiled copy of def changed by edit: the next release of
// the contract, as regenerated code would carry it.
func evolve(t *testing.T, def *sagadef.Definition, edit func(*sagadef.Definition)) *sagadef.Definition {
	t.Helper()
	next := &sagadef.Definition{
		Name: def.Name, Table: def.Table, StartMessage: def.StartMessage, DataMessage: def.DataMessage,
		Deadline: def.Deadline, Steps: slices.Clone(def.Steps),
	}
	edit(next)
	require.NoError(t, next.Compile())
	return next
}

// upgrade deploys next over the bundle's table: the state constraint is
// replaced as the generated states migration does (it found no instance in
// a removed state), and the engine runs the new definition.
func (b *testBundle) upgrade(t *testing.T, next *sagadef.Definition) {
	t.Helper()
	states := make([]string, len(next.States))
	for i, s := range next.States {
		states[i] = "'" + s.Name + "'"
	}
	table := pgx.Identifier{next.Table}.Sanitize()
	_, err := b.pool.Exec(context.Background(), `ALTER TABLE `+table+` DROP CONSTRAINT `+next.Table+`_state_check;
ALTER TABLE `+table+` ADD CONSTRAINT `+next.Table+`_state_check CHECK (state IN (`+strings.Join(states, ", ")+`))`)
	require.NoError(t, err)
	b.def = next
	b.engine = b.newEngine(t, nil)
}

// TestEvolutionRemovedCompensatableStep: a saga that completed a
// compensatable step under one release, and fails under a release whose
// definition no longer has that step (renamed or removed: the states
// migration passes, as no instance waits in its states), must not end
// FAILED with the step's effect silently left in place.
func TestEvolutionRemovedCompensatableStep(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	require.Equal(t, stPayment, b.mustReply(t, id, msgInventoryReserved).State)

	b.upgrade(t, evolve(t, b.def, func(d *sagadef.Definition) {
		d.Steps[0].Name = "ReserveStock"
	}))
	st := b.mustReply(t, id, msgPaymentDeclined)
	require.Equal(t, stManualReview, st.State, "the release of ReserveInventory's effect cannot be sent by this definition")
	require.Contains(t, st.ReviewReason, "ReserveInventory")
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
}

// TestEvolutionAddedStep: instances the first release left mid-flight — one
// waiting for a reply, one compensating, one with a timeout due, one in
// manual review — continue under a release that adds a step at the end of
// the saga (its states added by the states migration).
func TestEvolutionAddedStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, defOptions{shippingFails: true})
	waiting := b.start(t, "order-waiting")
	compensating := b.start(t, "order-compensating")
	b.mustReply(t, compensating, msgInventoryReserved)
	require.Equal(t, stCompReserve, b.mustReply(t, compensating, msgPaymentDeclined).State)
	due := b.start(t, "order-due")
	require.Equal(t, stPayment, b.mustReply(t, due, msgInventoryReserved).State)
	review := b.start(t, "order-review")
	b.mustReply(t, review, msgInventoryReserved)
	b.mustReply(t, review, msgPaymentAuthorized)
	require.Equal(t, stManualReview, b.mustReply(t, review, msgShippingFailed).State)

	b.upgrade(t, evolve(t, b.def, func(d *sagadef.Definition) {
		d.Steps = append(d.Steps, sagadef.Step{
			Name: "NotifyCustomer", Role: sagadef.RoleRetriable,
			Command: msgNotifyCustomer.FullName, SuccessReplies: []string{msgCustomerNotified.FullName},
			Timeout: stepTimeout, OnTimeout: sagadef.TimeoutRetry, MaxAttempts: 3, Late: sagadef.LateIgnore,
		})
	}))

	b.mustReply(t, waiting, msgInventoryReserved)
	b.mustReply(t, waiting, msgPaymentAuthorized)
	require.Equal(t, "NOTIFY_CUSTOMER", b.mustReply(t, waiting, msgShippingScheduled).State)
	require.Equal(t, stCompleted, b.mustReply(t, waiting, msgCustomerNotified).State)

	require.Equal(t, stFailed, b.mustReply(t, compensating, msgInventoryReleased).State)

	st, err := b.engine.Retry(ctx, review, b.status(t, review).Version, "alice", "shipping is back")
	require.NoError(t, err)
	require.Equal(t, stShipping, st.State)
	require.Equal(t, "NOTIFY_CUSTOMER", b.mustReply(t, review, msgShippingScheduled).State)

	b.clock.Advance(stepTimeout)
	fired, err := b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 2, fired, "order-due's payment step and order-review's new step")
	require.Equal(t, stCompReserve, b.status(t, due).State)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}, outboxTypes(b.outbox(t, due)))
}

// TestEvolutionRollingUpgradeTimeouts: while a release that adds a step
// rolls out, an engine of the old release scans the same table as one of the
// new. An instance in the added step is no business of the old engine's
// scanner: it must leave it alone (not defer it, not count a failure), so
// the new engine applies its timeout as the step says, rather than finding
// it deferred past MaxDeferrals and sending it to manual review as stuck.
func TestEvolutionRollingUpgradeTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, defOptions{})
	oldDef := b.def
	b.upgrade(t, evolve(t, b.def, func(d *sagadef.Definition) {
		d.Steps = append(d.Steps, sagadef.Step{
			Name: "NotifyCustomer", Role: sagadef.RoleRetriable,
			Command: msgNotifyCustomer.FullName, SuccessReplies: []string{msgCustomerNotified.FullName},
			Timeout: stepTimeout, OnTimeout: sagadef.TimeoutRetry, MaxAttempts: 3, Late: sagadef.LateIgnore,
		})
	}))
	b.engine = b.newEngine(t, func(c *saga.Config) { c.MaxDeferrals = 1 })
	old := b.newEngine(t, func(c *saga.Config) { c.Definition, c.MaxDeferrals = oldDef, 1 })

	id := b.start(t, "order-1")
	b.mustReply(t, id, msgInventoryReserved)
	b.mustReply(t, id, msgPaymentAuthorized)
	before := b.mustReply(t, id, msgShippingScheduled)
	require.Equal(t, "NOTIFY_CUSTOMER", before.State)

	for range 2 {
		b.clock.Advance(2 * time.Minute)
		_, err := old.FireTimeouts(ctx, 0)
		require.NoError(t, err)
	}
	after := b.status(t, id)
	require.Equal(t, before.Version, after.Version)
	require.Empty(t, after.LastError, "the old engine's scanner left the instance alone")

	b.clock.Advance(2 * time.Minute)
	fired, err := b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, fired)
	st := b.status(t, id)
	require.Equal(t, "NOTIFY_CUSTOMER", st.State, st.ReviewReason)
	require.Equal(t, 2, st.Attempt)
}
