package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
)

// TestConditionalStepSkipped: the engine asks the hooks whether a
// conditional step runs; a skipped step sends nothing, is recorded in the
// instance's progress and audited with the decider's reason, and is not
// compensated when a later step fails. An engine started afresh (a
// restart) reads the skip back from the database.
func TestConditionalStepSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{conditionalReserve: true})
	id := b.start(t, "skip-1")
	st := b.status(t, id)
	require.Equal(t, stPayment, st.State, "the first step was skipped at start")
	require.Equal(t, []string{"ReserveInventory"}, st.Progress.Skipped)
	require.Equal(t, []string{"AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
	h := b.history(t, id)
	require.Len(t, h, 1)
	require.Contains(t, h[0].Note, "skipped conditional step ReserveInventory: order skip-1 does not need ReserveInventory")

	b.engine = b.newEngine(t, nil)
	st = b.mustReply(t, id, msgPaymentDeclined)
	require.Equal(t, stFailed, st.State)
	require.Equal(t, []string{"ReserveInventory"}, st.Progress.Skipped)
	require.Equal(t, []string{"AuthorizePayment"}, outboxTypes(b.outbox(t, id)), "nothing to compensate: the skipped step never ran")
}

// TestConditionalStepRun: a conditional step the decider keeps runs and
// is compensated like any other.
func TestConditionalStepRun(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{conditionalReserve: true})
	id := b.start(t, "keep-1")
	require.Equal(t, stReserve, b.status(t, id).State)
	b.mustReply(t, id, msgInventoryReserved)
	st := b.mustReply(t, id, msgPaymentDeclined)
	require.Equal(t, stCompReserve, st.State)
	require.Empty(t, st.Progress.Skipped)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)))
}

// TestConditionalDecisionFails: a skip decision that fails fails the
// transition as a whole: no instance, no command, and the start can be
// delivered again.
func TestConditionalDecisionFails(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{conditionalReserve: true})
	_, _, err := b.engine.Start(context.Background(), msg(msgPlaceOrder, "skiperr-1"), message.Meta{MessageID: newID()})
	require.ErrorContains(t, err, "decide whether to skip step ReserveInventory")
	require.ErrorContains(t, err, "inventory policy service unavailable")
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_place_order`).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_outbox`).Scan(&n))
	require.Zero(t, n)
}

// TestExternalCheckStep: an external check step waits for its event with
// nothing to undo; its timeout compensates the steps before it and the
// compensation passes over it.
func TestExternalCheckStep(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{externalCheck: true})

	ok := b.start(t, "check-ok")
	b.mustReply(t, ok, msgInventoryReserved)
	require.Equal(t, "APPROVE_ORDER", b.status(t, ok).State)
	require.Equal(t, []string{"ReserveInventory"}, outboxTypes(b.outbox(t, ok)), "an external step sends nothing")
	_, err := b.reply(t, "", msg(msgPaymentApproved, "check-ok"), "")
	require.NoError(t, err)
	require.Equal(t, stPayment, b.status(t, ok).State)

	b = setup(t, defOptions{externalCheck: true})
	late := b.start(t, "check-late")
	b.mustReply(t, late, msgInventoryReserved)
	b.clock.Advance(stepTimeout + time.Second)
	n, err := b.engine.FireTimeouts(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the check step's timeout is due")
	st := b.status(t, late)
	require.Equal(t, stCompReserve, st.State)
	require.Equal(t, []string{"ApproveOrder"}, st.Progress.Stopped)
	st = b.mustReply(t, late, msgInventoryReleased)
	require.Equal(t, stFailed, st.State)
	require.Equal(t, []string{"ReserveInventory", "ReleaseInventory"}, outboxTypes(b.outbox(t, late)))
}
