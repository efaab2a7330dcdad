package admin_test

import (
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/message"
)

// toShipping drives a new saga to SCHEDULE_SHIPPING.
func (b *bundle) toShipping(t *testing.T, order string) string {
	t.Helper()
	id := b.start(t, order)
	b.reply(t, id, &inventoryv1.InventoryReserved{OrderId: order})
	b.reply(t, id, &paymentv1.PaymentAuthorized{OrderId: order, AuthorizationId: "auth-" + order})
	require.Equal(t, "SCHEDULE_SHIPPING", b.status(t, id).State)
	return id
}

// actionsOf returns the allowed repairs of a timeline ("resolve:COMPLETED"
// for resolve) and the views by that name.
func actionsOf(tl admin.Timeline) ([]string, map[string]admin.ActionView) {
	var allowed []string
	all := map[string]admin.ActionView{}
	for _, a := range tl.Actions {
		name := a.Action
		if a.To != "" {
			name += ":" + a.To
		}
		all[name] = a
		if a.Allowed {
			allowed = append(allowed, name)
		}
	}
	return allowed, all
}

// TestRepairsOfferedByState: a timeline lists the repairs the state machine
// allows in the saga's state, each with what it would do; a saga that
// ended offers none, and one that completed shows no last error.
func TestRepairsOfferedByState(t *testing.T) {
	t.Parallel()
	b := setup(t)

	waiting := b.start(t, "offer-waiting")
	allowed, all := actionsOf(getJSON[admin.Timeline](t, b, "/api/sagas/"+waiting))
	require.Equal(t, []string{"retry", "compensate", "cancel"}, allowed)
	require.Contains(t, all["retry"].Effect, "sends ReserveInventory and the saga stays in RESERVE_INVENTORY")
	require.Equal(t, "COMPENSATING_RESERVE_INVENTORY", all["compensate"].Reaches)
	require.Contains(t, all["cancel"].Effect, "ends the saga as CANCELLED without compensating")
	require.Contains(t, all["resolve:COMPLETED"].Refusal, "does not allow resolve in state RESERVE_INVENTORY")

	review := b.manualReview(t, "offer-review")
	allowed, all = actionsOf(getJSON[admin.Timeline](t, b, "/api/sagas/"+review))
	require.Equal(t, []string{"retry", "compensate", "cancel", "resolve:COMPLETED", "resolve:FAILED", "resolve:CANCELLED"}, allowed)
	require.Equal(t, "AUTHORIZE_PAYMENT", all["retry"].Reaches, "retry resumes the state it came from")
	require.Equal(t, []string{"AuthorizePayment"}, all["retry"].Sends)
	require.Contains(t, all["cancel"].Effect, "ReserveInventory stay done (compensate first to undo them)")

	// A saga whose payment went unanswered (manual review), retried by an
	// operator, then completed.
	done := b.manualReview(t, "offer-done")
	require.Contains(t, b.status(t, done).LastError, "retry budget exhausted")
	postJSON[admin.ActionResult](t, b, "/api/sagas/"+done+"/retry",
		admin.ActionRequest{ExpectedVersion: b.status(t, done).Version, Reason: "provider back"}, http.StatusOK)
	b.reply(t, done, &paymentv1.PaymentAuthorized{OrderId: "offer-done", AuthorizationId: "auth-1"})
	b.reply(t, done, &shippingv1.ShippingScheduled{OrderId: "offer-done", TrackingId: "T-1"})
	b.reply(t, done, &orderv1.OrderApproved{OrderId: "offer-done"})
	require.Equal(t, "COMPLETED", b.status(t, done).State)
	require.Contains(t, b.status(t, done).LastError, "retry budget exhausted", "the engine keeps it; the API does not show it")

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+done)
	allowed, all = actionsOf(tl)
	require.Empty(t, allowed, "a completed saga offers no repair")
	require.Contains(t, all["retry"].Refusal, "ended in COMPLETED")
	require.Empty(t, tl.Saga.LastError)
	page := getJSON[admin.SagaPage](t, b, "/api/sagas?business_key=offer-done")
	require.Len(t, page.Items, 1)
	require.Empty(t, page.Items[0].LastError)
	require.NotEmpty(t, getJSON[admin.Timeline](t, b, "/api/sagas/"+review).Saga.LastError, "a saga in review shows it")
}

// parkCommand parks the command saga id waits on now (its outbox row) from
// queue, as the participant's consumer would, and returns the parked id.
func (b *bundle) parkCommand(t *testing.T, id, queue, reason string) int64 {
	t.Helper()
	st := b.status(t, id)
	var env message.Envelope
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT message_id, message_type, exchange, routing_key, body FROM saga_outbox WHERE message_id = $1`,
		st.PendingMessageID).Scan(&env.MessageID, &env.MessageType, &env.Exchange, &env.RoutingKey, &env.Body))
	env.SagaID, env.SagaType, env.SchemaVersion = id, st.Type, 1
	return b.park(t, env, queue, reason)
}

func parkedByID(items []admin.Parked) map[int64]admin.Parked {
	out := map[int64]admin.Parked{}
	for _, p := range items {
		out[p.ID] = p
	}
	return out
}

// TestSupersededCopiesAreDismissed: a step's command parked, resent by its
// timeout and parked again: the first copy is superseded, the second
// current. Dismissing closes a superseded copy with who and why, on the row
// and in the saga's audit trail; a current copy is refused unless forced,
// and a bulk dismissal never closes one.
func TestSupersededCopiesAreDismissed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.toShipping(t, "dismiss-1")
	first := b.parkCommand(t, id, "shipping.commands", `no carrier serves country "IS"`)
	b.clock.Advance(2 * time.Minute) // the step's timeout resends ScheduleShipping
	_, err := b.engine.FireTimeouts(t.Context(), 100)
	require.NoError(t, err)
	second := b.parkCommand(t, id, "shipping.commands", `no carrier serves country "IS"`)

	page := getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id)
	byID := parkedByID(page.Items)
	require.Equal(t, admin.StandingSuperseded, byID[first].Standing)
	require.Contains(t, byID[first].StandingNote, "no longer waits for this command")
	require.Equal(t, admin.StandingCurrent, byID[second].Standing)
	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	var standings []string
	for _, e := range tl.Events {
		if e.Kind == admin.EventParked {
			standings = append(standings, e.Standing)
		}
	}
	require.Equal(t, []string{admin.StandingSuperseded, admin.StandingCurrent}, standings)

	// The current copy: refused, unless forced.
	code, raw := b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(second)+"/dismiss", admin.DismissRequest{Reason: "tidy"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	require.Equal(t, "refused", apiError(t, raw).Code)
	require.Contains(t, apiError(t, raw).Message, "current copy")
	code, _ = b.call(t, readToken, http.MethodPost, "/api/parked/"+itoa(first)+"/dismiss", admin.DismissRequest{Reason: "tidy"})
	require.Equal(t, http.StatusForbidden, code)

	// A bulk dismissal of the saga's copies: the dry run says what each
	// would do, the run closes only the superseded one.
	bulk := admin.BulkDismissRequest{Filter: admin.ParkedFilter{SagaID: id}, Reason: "superseded by the resend", DryRun: true}
	dry := postJSON[admin.BulkDismissResult](t, b, "/api/bulk/parked/dismiss", bulk, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldDismiss: 1, admin.OutcomeRefused: 1}, dry.Counts)
	require.Equal(t, first, dry.Items[0].Parked.ID, "oldest first")
	require.Equal(t, admin.OutcomeWouldDismiss, dry.Items[0].Outcome)
	require.Equal(t, admin.OutcomeRefused, dry.Items[1].Outcome)
	require.Len(t, getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id).Items, 2, "a dry run changes nothing")
	bulk.DryRun = false
	done := postJSON[admin.BulkDismissResult](t, b, "/api/bulk/parked/dismiss", bulk, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeDismissed: 1, admin.OutcomeRefused: 1}, done.Counts)

	open := getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id)
	require.Len(t, open.Items, 1)
	require.Equal(t, second, open.Items[0].ID)
	all := parkedByID(getJSON[admin.ParkedPage](t, b, "/api/parked?include_replayed=true&saga_id="+id).Items)
	require.Equal(t, "alice", all[first].DismissedBy)
	require.Equal(t, "superseded by the resend", all[first].DismissReason)
	require.NotNil(t, all[first].DismissedAt)
	note := b.lastAudit(t, id)
	require.Equal(t, admin.TriggerDismiss, note.Trigger)
	require.Equal(t, "alice", note.Operator)
	require.Contains(t, note.Note, "superseded by the resend")
	require.Contains(t, note.Note, "dismissed parked message "+itoa(first))

	// Closed stays closed.
	again := postJSON[admin.DismissResult](t, b, "/api/parked/"+itoa(first)+"/dismiss", admin.DismissRequest{Reason: "again"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyClosed, again.Outcome)
	replay := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(first)+"/replay", admin.ReplayRequest{Reason: "again"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyClosed, replay.Outcome)

	forced := postJSON[admin.DismissResult](t, b, "/api/parked/"+itoa(second)+"/dismiss", admin.DismissRequest{Reason: "will retry", Force: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeDismissed, forced.Outcome)
	require.Contains(t, forced.Explanation, "FORCED")
	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id).Items)
	require.Equal(t, "SCHEDULE_SHIPPING", b.status(t, id).State, "a dismissal changes nothing about the saga")
}

// TestParkedWithoutSagaMetadataIsLinked: a reply published without saga
// metadata (its correlation field is the business key, as the saga's
// consumer finds it) is parked with no saga id. The API links it to its
// saga by its correlation id: listed under the saga, checked against it
// before a replay, and the replay audited in its trail, the message going
// out as it came.
func TestParkedWithoutSagaMetadataIsLinked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-unlinked")
	reply := &inventoryv1.InventoryReserved{OrderId: "order-unlinked"}
	env, err := message.New(reply, message.Meta{CausationID: b.status(t, id).PendingMessageID})
	require.NoError(t, err)
	require.Empty(t, env.SagaID)
	require.Equal(t, "order-unlinked", reply.CorrelationKey(), "its correlation field is the business key")
	pid := b.park(t, env, "order.saga.place_order", "fold failed")

	page := getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+id)
	require.Len(t, page.Items, 1)
	p := page.Items[0]
	require.Equal(t, id, p.SagaID)
	require.Equal(t, "correlation", p.LinkedBy)
	require.Equal(t, "order-unlinked", p.BusinessKey)
	require.Equal(t, "ReserveInventory", p.Step)
	require.Equal(t, admin.StandingCurrent, p.Standing)
	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, 1, tl.Counts.Parked)

	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: "fold fixed"}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, "new", res.Check.Class, "checked against the saga")
	note := b.lastAudit(t, id)
	require.Equal(t, admin.TriggerReplay, note.Trigger)
	require.Contains(t, note.Note, "fold fixed")
	var sagaID string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT saga_id FROM saga_outbox WHERE message_id = $1`, env.MessageID).Scan(&sagaID))
	require.Empty(t, sagaID, "replayed as it came, without saga metadata")
}

// TestFind: counts per state and type, search by saga id, business key (and
// its start), message id and correlation id, the saga list's prefix, time
// window and order, the parked filters, and the log of operator actions.
func TestFind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.manualReview(t, "other-review")
	b.clock.Advance(time.Second)
	a := b.start(t, "find-a")
	b.clock.Advance(time.Second)
	c := b.start(t, "find-c")
	pid := b.park(t, b.replyEnvelope(t, a, &inventoryv1.InventoryReserved{OrderId: "find-a"}), "order.saga.place_order", "Fold FAILED: bug 17")

	stats := getJSON[admin.Stats](t, b, "/api/stats")
	require.Len(t, stats.Types, 1)
	counts := map[string]int64{}
	for _, s := range stats.Types[0].States {
		counts[s.State] = s.Count
	}
	require.Equal(t, int64(3), stats.Types[0].Total)
	require.Equal(t, int64(2), counts["RESERVE_INVENTORY"])
	require.Equal(t, int64(1), counts["MANUAL_REVIEW"])
	require.Equal(t, int64(0), counts["COMPLETED"], "every state is listed")
	require.Equal(t, int64(1), stats.Parked.Open)
	require.Equal(t, int64(1), stats.Parked.ByQueue["order.saga.place_order"])

	search := func(q string) map[string]string { // saga id or parked id → matched
		t.Helper()
		res := getJSON[admin.SearchResult](t, b, "/api/search?q="+url.QueryEscape(q))
		out := map[string]string{}
		for _, h := range res.Hits {
			key := ""
			if h.Saga != nil {
				key = h.Saga.ID
			}
			if h.ParkedID != 0 {
				key = "parked:" + itoa(h.ParkedID)
			}
			out[key] = h.Matched
		}
		return out
	}
	require.Equal(t, map[string]string{a: "saga id", "parked:" + itoa(pid): "correlation id"}, search(a), "the saga, and its parked reply (replies correlate on the saga id)")
	require.Equal(t, map[string]string{c: "business key"}, search("find-c"))
	require.Equal(t, map[string]string{a: "business key prefix", c: "business key prefix"}, search("find-"))
	pending := b.status(t, c).PendingMessageID // its ReserveInventory, in the outbox
	require.Equal(t, map[string]string{c: "message id"}, search(pending))
	var parkedMsg string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT message_id FROM saga_parked WHERE id = $1`, pid).Scan(&parkedMsg))
	require.Equal(t, map[string]string{"parked:" + itoa(pid): "parked message id"}, search(parkedMsg))
	require.Empty(t, search("nothing-like-it"))
	code, _ := b.call(t, readToken, http.MethodGet, "/api/search?q=", nil)
	require.Equal(t, http.StatusBadRequest, code)

	// The list: prefix, order, window.
	ids := func(path string) []string {
		t.Helper()
		var out []string
		for _, s := range getJSON[admin.SagaPage](t, b, path).Items {
			out = append(out, s.ID)
		}
		return out
	}
	require.Equal(t, []string{c, a}, ids("/api/sagas?key_prefix=find-"))
	require.Equal(t, []string{a, c}, ids("/api/sagas?key_prefix=find-&sort=oldest"))
	after := b.status(t, a).CreatedAt.Add(500 * time.Millisecond).Format(time.RFC3339Nano)
	require.Equal(t, []string{c}, ids("/api/sagas?created_after="+url.QueryEscape(after)))
	code, _ = b.call(t, readToken, http.MethodGet, "/api/sagas?sort=sideways", nil)
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = b.call(t, readToken, http.MethodGet, "/api/sagas?created_after=yesterday", nil)
	require.Equal(t, http.StatusBadRequest, code)

	// Parked filters: reason (any case), age.
	require.Len(t, getJSON[admin.ParkedPage](t, b, "/api/parked?reason=fold+failed").Items, 1)
	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked?reason=carrier").Items)
	require.Len(t, getJSON[admin.ParkedPage](t, b, "/api/parked?newer_than=1h").Items, 1)
	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked?older_than=1h").Items)
	code, _ = b.call(t, readToken, http.MethodGet, "/api/parked?older_than=soon", nil)
	require.Equal(t, http.StatusBadRequest, code)

	// The operator log: actions across sagas, newest first.
	v := b.status(t, c).Version
	postJSON[admin.ActionResult](t, b, "/api/sagas/"+c+"/cancel", admin.ActionRequest{ExpectedVersion: v, Reason: "customer called"}, http.StatusOK)
	postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: "bug 17 fixed"}, http.StatusOK)
	log := getJSON[admin.OperatorLog](t, b, "/api/operator-log")
	require.Len(t, log.Items, 2)
	require.Equal(t, admin.TriggerReplay, log.Items[0].Action)
	require.Equal(t, a, log.Items[0].SagaID)
	require.Equal(t, "find-a", log.Items[0].BusinessKey)
	require.Equal(t, "operator.cancel", log.Items[1].Action)
	require.Equal(t, "alice", log.Items[1].Operator)
	require.Contains(t, log.Items[1].Note, "customer called")
	require.Equal(t, "CANCELLED", log.Items[1].To)
	one := getJSON[admin.OperatorLog](t, b, "/api/operator-log?limit=1")
	require.Len(t, one.Items, 1)
	require.NotEmpty(t, one.NextCursor)
	next := getJSON[admin.OperatorLog](t, b, "/api/operator-log?limit=1&cursor="+one.NextCursor)
	require.Equal(t, log.Items[1].AuditID, next.Items[0].AuditID)
	cancels := getJSON[admin.OperatorLog](t, b, "/api/operator-log?action=cancel")
	require.Len(t, cancels.Items, 1)
	require.True(t, slices.ContainsFunc(log.Items, func(x admin.OperatorAction) bool { return x.SagaID == c }))
}
