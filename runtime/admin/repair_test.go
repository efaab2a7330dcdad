package admin_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/saga"
)

// lastAudit returns the saga's newest audit row.
func (b *bundle) lastAudit(t *testing.T, id string) saga.AuditRecord {
	t.Helper()
	h := b.audit(t, id)
	require.NotEmpty(t, h)
	return h[len(h)-1]
}

func TestRepairsAreAuditedAndIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.manualReview(t, "order-repair")
	v := b.status(t, id).Version

	// Retry: applied, audited with who and why.
	res := postJSON[admin.ActionResult](t, b, "/api/sagas/"+id+"/retry",
		admin.ActionRequest{ExpectedVersion: v, Reason: "payment provider is back"}, http.StatusOK)
	require.Equal(t, admin.OutcomeApplied, res.Outcome)
	require.Equal(t, "AUTHORIZE_PAYMENT", res.Saga.State)
	require.Equal(t, v+1, res.Saga.Version)
	a := b.lastAudit(t, id)
	require.Equal(t, "operator.retry", a.Trigger)
	require.Equal(t, "alice", a.Operator)
	require.Contains(t, a.Note, "payment provider is back")
	n := len(b.audit(t, id))

	// The same request again (its answer was lost): recognised, nothing done.
	res = postJSON[admin.ActionResult](t, b, "/api/sagas/"+id+"/retry",
		admin.ActionRequest{ExpectedVersion: v, Reason: "payment provider is back"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyApplied, res.Outcome)
	require.Equal(t, v+1, res.Saga.Version)
	require.Len(t, b.audit(t, id), n)

	// Another operator deciding on the old version is refused.
	code, raw := b.call(t, repairToken, http.MethodPost, "/api/sagas/"+id+"/compensate",
		admin.ActionRequest{ExpectedVersion: v, Reason: "undo"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	e := apiError(t, raw)
	require.Equal(t, "version_conflict", e.Code)
	require.Contains(t, e.Message, "you decided on version")

	// Cancel, then cancel again: the second is a no-op.
	res = postJSON[admin.ActionResult](t, b, "/api/sagas/"+id+"/cancel",
		admin.ActionRequest{ExpectedVersion: v + 1, Reason: "customer withdrew"}, http.StatusOK)
	require.Equal(t, admin.OutcomeApplied, res.Outcome)
	require.Equal(t, "CANCELLED", res.Saga.State)
	a = b.lastAudit(t, id)
	require.Equal(t, "operator.cancel", a.Trigger)
	require.Equal(t, "alice", a.Operator)
	require.Contains(t, a.Note, "customer withdrew")
	res = postJSON[admin.ActionResult](t, b, "/api/sagas/"+id+"/cancel",
		admin.ActionRequest{ExpectedVersion: v + 1, Reason: "customer withdrew"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyApplied, res.Outcome)
	require.Len(t, b.audit(t, id), n+1)

	// The state machine refuses a retry of an ended saga.
	code, raw = b.call(t, repairToken, http.MethodPost, "/api/sagas/"+id+"/retry",
		admin.ActionRequest{ExpectedVersion: v + 2, Reason: "again"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	require.Equal(t, "rejected", apiError(t, raw).Code)

	// Resolve a manual review; compensate a saga past its first step.
	rv := b.manualReview(t, "order-resolve")
	res = postJSON[admin.ActionResult](t, b, "/api/sagas/"+rv+"/resolve",
		admin.ActionRequest{ExpectedVersion: b.status(t, rv).Version, To: "COMPLETED", Reason: "charged by phone"}, http.StatusOK)
	require.Equal(t, "COMPLETED", res.Saga.State)
	a = b.lastAudit(t, rv)
	require.Equal(t, "operator.resolve", a.Trigger)
	require.Contains(t, a.Note, "charged by phone")

	cp := b.start(t, "order-compensate")
	b.reply(t, cp, &inventoryv1.InventoryReserved{OrderId: "order-compensate"})
	res = postJSON[admin.ActionResult](t, b, "/api/sagas/"+cp+"/compensate",
		admin.ActionRequest{ExpectedVersion: b.status(t, cp).Version, Reason: "fraud suspected"}, http.StatusOK)
	require.Equal(t, "COMPENSATING_RESERVE_INVENTORY", res.Saga.State)
	a = b.lastAudit(t, cp)
	require.Equal(t, "operator.compensate", a.Trigger)
	require.Equal(t, "alice", a.Operator)
	require.Equal(t, 1, strings.Count(a.Note, "fraud suspected"), "the reason is noted once: %s", a.Note)
	var releases int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_outbox WHERE saga_id = $1 AND message_type = 'shop.inventory.v1.ReleaseInventory'`, cp).Scan(&releases))
	require.Equal(t, 1, releases, "compensation sent through the outbox")

	// The position says what the compensation's timeout will do: resend it
	// while attempts are left, manual review on the last one.
	for attempt := 1; attempt <= 5; attempt++ {
		tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+cp)
		require.Equal(t, "COMPENSATING_RESERVE_INVENTORY", tl.Position.State)
		require.Equal(t, attempt, tl.Position.Attempt)
		want := "; resent on timeout at "
		if attempt == 5 {
			want = "; manual review on timeout at "
		}
		require.Contains(t, tl.Position.Summary, want, "attempt %d", attempt)
		b.clock.Advance(31 * time.Second)
		n, err := b.engine.FireTimeouts(t.Context(), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	require.Equal(t, "MANUAL_REVIEW", b.status(t, cp).State)
}

// An operator decides on a version while a live reply for the same saga is
// being applied; the reply commits first, and the repair is refused rather
// than applied to a state the operator never saw.
func TestRepairRacingLiveReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.start(t, "order-race")
	seen := b.status(t, id) // what the operator looks at: version 1

	reply := &inventoryv1.InventoryReserved{OrderId: "order-race"}
	env := b.replyEnvelope(t, id, reply)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, b.engine.Handle(ctx, tx, deliveryOf(env, reply))) // holds the saga's row lock
	var xid string
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid))

	type answer struct {
		code int
		raw  []byte
	}
	done := make(chan answer, 1)
	go func() {
		code, raw := b.call(t, repairToken, http.MethodPost, "/api/sagas/"+id+"/compensate",
			admin.ActionRequest{ExpectedVersion: seen.Version, Reason: "looks stuck"})
		done <- answer{code, raw}
	}()
	// Wait until the repair is blocked on the reply's transaction.
	require.Eventually(t, func() bool {
		var waiting int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'
	AND transactionid::text = $1`, xid).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))

	got := <-done
	require.Equal(t, http.StatusConflict, got.code, string(got.raw))
	e := apiError(t, got.raw)
	require.Equal(t, "version_conflict", e.Code)
	st := b.status(t, id)
	require.Equal(t, "AUTHORIZE_PAYMENT", st.State, "the live reply won")
	for _, a := range b.audit(t, id) {
		require.NotEqual(t, "operator.compensate", a.Trigger, "the refused repair left no trace but its answer")
	}
}

func TestBulkRepair(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var stuck []string
	for _, k := range []string{"bulk-1", "bulk-2", "bulk-3"} {
		stuck = append(stuck, b.start(t, k))
	}
	b.clock.Advance(time.Minute)
	fresh := b.start(t, "bulk-fresh")

	req := admin.BulkRequest{Filter: admin.SagaFilter{Stuck: true}, Reason: "warehouse outage", DryRun: true}
	dry := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/cancel", req, http.StatusOK)
	require.True(t, dry.DryRun)
	require.Len(t, dry.Items, 3)
	require.Equal(t, map[string]int{admin.OutcomeWouldApply: 3}, dry.Counts)
	for _, it := range dry.Items {
		require.Contains(t, stuck, it.SagaID)
		require.Equal(t, "CANCELLED", it.To)
	}
	for _, id := range stuck {
		require.Equal(t, "RESERVE_INVENTORY", b.status(t, id).State, "a dry run changes nothing")
		require.Len(t, b.audit(t, id), 1)
	}
	// Resolve is only for manual review: the dry run says the machine refuses it.
	resolve := req
	resolve.To = "COMPLETED"
	dryResolve := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/resolve", resolve, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldReject: 3}, dryResolve.Counts)
	require.Contains(t, dryResolve.Items[0].Error, "does not allow resolve in state RESERVE_INVENTORY")

	req.DryRun, req.Max = false, 2
	res := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/cancel", req, http.StatusOK)
	require.True(t, res.Truncated)
	require.Equal(t, map[string]int{admin.OutcomeApplied: 2}, res.Counts)
	req.Max = 0
	res = postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/cancel", req, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeApplied: 1}, res.Counts, "the cancelled ones are no longer stuck")
	for _, id := range stuck {
		require.Equal(t, "CANCELLED", b.status(t, id).State)
		a := b.lastAudit(t, id)
		require.Equal(t, "alice", a.Operator)
		require.Contains(t, a.Note, "warehouse outage")
	}
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, fresh).State)
}

// TestBulkDryRunSaysWhereEachSagaGoes: a dry run names the one state each
// saga would reach and what it would send, as the state machine decides on
// the instance (a saga in manual review resumes the state it came from),
// not every state the transition table allows from its state.
func TestBulkDryRunSaysWhereEachSagaGoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	review := b.manualReview(t, "dry-review") // from AUTHORIZE_PAYMENT
	waiting := b.start(t, "dry-waiting")      // RESERVE_INVENTORY

	dry := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/retry",
		admin.BulkRequest{Filter: admin.SagaFilter{KeyPrefix: "dry-"}, Reason: "provider back", DryRun: true}, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldApply: 2}, dry.Counts)
	byID := map[string]admin.BulkItem{}
	for _, it := range dry.Items {
		byID[it.SagaID] = it
	}
	require.Equal(t, "AUTHORIZE_PAYMENT", byID[review].To, "the state it came from, not every state a retry may lead to")
	require.Equal(t, []string{"AuthorizePayment"}, byID[review].Sends)
	require.Contains(t, byID[review].Effect, "sends AuthorizePayment and the saga goes to AUTHORIZE_PAYMENT")
	require.Equal(t, "RESERVE_INVENTORY", byID[waiting].To)
	require.Equal(t, []string{"ReserveInventory"}, byID[waiting].Sends)
	require.Contains(t, byID[waiting].Effect, "the saga stays in RESERVE_INVENTORY")

	comp := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/compensate",
		admin.BulkRequest{Filter: admin.SagaFilter{BusinessKey: "dry-waiting"}, Reason: "fraud", DryRun: true}, http.StatusOK)
	require.Equal(t, "COMPENSATING_RESERVE_INVENTORY", comp.Items[0].To)
	require.Equal(t, []string{"ReleaseInventory"}, comp.Items[0].Sends)
	require.Equal(t, "MANUAL_REVIEW", b.status(t, review).State, "a dry run changes nothing")
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, waiting).State)
	require.Len(t, b.audit(t, waiting), 1)
}

// TestRepairsOfASagaWithUnreadableData: for a saga whose stored data cannot
// be decoded, a dry run says retry would be refused (cancel would apply),
// the timeline shows the decode error where the data would be, and the
// check of a parked reply for it says the reply would be parked again.
func TestRepairsOfASagaWithUnreadableData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-garbled")
	_, err := b.pool.Exec(t.Context(), `UPDATE saga_place_order SET data = '\xffffff'::bytea WHERE id = $1`, id)
	require.NoError(t, err)

	req := admin.BulkRequest{Filter: admin.SagaFilter{BusinessKey: "order-garbled"}, Reason: "try", DryRun: true}
	retry := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/retry", req, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldReject: 1}, retry.Counts)
	require.Contains(t, retry.Items[0].Error, "saga data cannot be decoded")
	cancel := postJSON[admin.BulkResult](t, b, "/api/bulk/sagas/cancel", req, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldApply: 1}, cancel.Counts)

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.NotNil(t, tl.Data)
	require.Empty(t, tl.Data.JSON)
	require.Contains(t, tl.Data.Note, "saga data cannot be decoded")

	reply := &inventoryv1.InventoryReserved{OrderId: "order-garbled"}
	parked := b.park(t, b.replyEnvelope(t, id, reply), "order.saga.place_order", "garbled")
	code, raw := b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(parked)+"/replay", admin.ReplayRequest{Reason: "r", DryRun: true})
	require.Equal(t, http.StatusConflict, code, string(raw))
	e := apiError(t, raw)
	require.Equal(t, "refused", e.Code)
	require.Contains(t, e.Message, "saga data cannot be decoded")
	require.Contains(t, e.Message, "would be parked again")
}
