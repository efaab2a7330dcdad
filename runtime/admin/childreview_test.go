package admin_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestChildInReviewIsStuck: a saga whose step waits on a child saga in
// manual review (the record its engine keeps in progress.child_review) is
// in the stuck list at once, long before its step timeout, with the child
// named in the reason; the console's stuck list and saga page show that
// reason. The engine's side (recording the child's reply) is tested in
// runtime/saga.
func TestChildInReviewIsStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "child-review-1")
	other := b.start(t, "child-review-2")
	const account = "shop.payment.v1.Payment 0b6c (business key pay-42): card declined"
	progress, err := json.Marshal(sagadef.Progress{ChildReview: &sagadef.ChildReview{Step: "ReserveInventory", Reason: account}})
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE saga_place_order SET progress = $2::jsonb WHERE id = $1`, id, string(progress))
	require.NoError(t, err)

	const want = "step ReserveInventory waits on a child in manual review: " + account
	stuck := getJSON[admin.SagaPage](t, b, "/api/sagas?stuck=true")
	require.Len(t, stuck.Items, 1, "only the saga whose child is in review; %s is on time", other)
	require.Equal(t, id, stuck.Items[0].ID)
	require.True(t, stuck.Items[0].Stuck)
	require.Equal(t, want, stuck.Items[0].StuckReason)
	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, want, tl.Saga.StuckReason)
	require.Equal(t, &sagadef.ChildReview{Step: "ReserveInventory", Reason: account}, tl.Progress.ChildReview)

	c := openConsole(t, b, readToken)
	c.open("#/sagas?stuck=true", "tr.saga-row")
	var rows []string
	c.eval(`[...document.querySelectorAll("tr.saga-row")].map((r) => r.dataset.id)`, &rows)
	require.Equal(t, []string{id}, rows)
	require.Contains(t, c.text("tr.saga-row"), want)
	c.open("#/saga/"+id, "#facts")
	require.Contains(t, c.text("#facts"), want)
	require.Contains(t, c.attr("#saga-state", "class"), "stuck")
}

// TestCancelRecordedInReview: a business cancel a saga in manual review
// recorded (progress.cancel; the engine's side is tested in
// runtime/sagadef and runtime/host) is in its timeline, and the console's
// saga page says who asked, why, and what compensating now does.
func TestCancelRecordedInReview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.manualReview(t, "cancel-review-1")
	cancel := &sagadef.Cancellation{RequestedBy: "booking", Reason: "booking b-7 compensates", MessageID: "0b6c3f9e-7a51-4c1e-9d2a-3f1e5b8c9d01"}
	progress, err := json.Marshal(cancel)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE saga_place_order SET progress = jsonb_set(progress, '{cancel}', $2::jsonb) WHERE id = $1`, id, string(progress))
	require.NoError(t, err)

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, cancel, tl.Progress.Cancel)

	c := openConsole(t, b, readToken)
	c.open("#/saga/"+id, "#facts")
	containsAll(t, c.text("#facts"), "Cancel requested", "by booking: booking b-7 compensates",
		"compensate and the saga ends CANCELLED")
}
