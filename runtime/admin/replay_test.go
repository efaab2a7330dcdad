package admin_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/outbox"
)

// outboxRow is what a replay leaves in saga_outbox.
type outboxRow struct {
	Count                int
	Exchange, RoutingKey string
	SagaID, Causation    string
	Published, Pending   bool
	Body                 []byte
}

func (b *bundle) outboxOf(t *testing.T, messageID string) outboxRow {
	t.Helper()
	var r outboxRow
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*), coalesce(max(exchange), ''), coalesce(max(routing_key), ''),
	coalesce(max(saga_id), ''), coalesce(max(causation_id), ''), coalesce(bool_or(s.id IS NOT NULL), false),
	coalesce(bool_or(EXISTS (SELECT FROM saga_outbox_pending p WHERE p.id = o.id)), false),
	coalesce((array_agg(body))[1], ''::bytea)
FROM saga_outbox o LEFT JOIN saga_outbox_sent s ON s.id = o.id WHERE message_id = $1`, messageID).
		Scan(&r.Count, &r.Exchange, &r.RoutingKey, &r.SagaID, &r.Causation, &r.Published, &r.Pending, &r.Body))
	return r
}

func TestReplayParkedReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-replay")
	reply := &inventoryv1.InventoryReserved{OrderId: "order-replay"}
	env := b.replyEnvelope(t, id, reply)
	pid := b.park(t, env, "order.saga.place_order", "OnInventoryReserved: boom")

	// Listed, joined to its saga.
	page := getJSON[admin.ParkedPage](t, b, "/api/parked")
	require.Len(t, page.Items, 1)
	p := page.Items[0]
	require.Equal(t, pid, p.ID)
	require.Equal(t, env.MessageID, p.MessageID)
	require.Equal(t, id, p.SagaID)
	require.Equal(t, "order-replay", p.BusinessKey)
	require.Equal(t, "ReserveInventory", p.Step)
	require.Equal(t, "RESERVE_INVENTORY", p.SagaState)
	require.Equal(t, "permanent", p.Class)
	require.Equal(t, 1, p.Attempts)
	require.Equal(t, "OnInventoryReserved: boom", p.Reason)
	require.Nil(t, p.ReplayedAt)

	// Dry run: the check passes, nothing changes.
	dry := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay",
		admin.ReplayRequest{Reason: "fixed the fold", DryRun: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeWouldReplay, dry.Outcome)
	require.True(t, dry.Check.Allowed)
	require.Equal(t, "new", dry.Check.Class)
	require.Equal(t, 0, b.outboxOf(t, env.MessageID).Count)

	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay",
		admin.ReplayRequest{Reason: "fixed the fold"}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, env.MessageID, res.MessageID)
	require.Equal(t, "alice", res.Parked.ReplayedBy)
	o := b.outboxOf(t, env.MessageID)
	require.Equal(t, outboxRow{Count: 1, Exchange: "shop.inventory.v1.replies", RoutingKey: "reply.shop.inventory.v1.inventory-reserved",
		SagaID: id, Causation: env.CausationID, Pending: true, Body: env.Body}, o, "same message id, original routing, unpublished")
	a := b.lastAudit(t, id)
	require.Equal(t, admin.TriggerReplay, a.Trigger)
	require.Equal(t, "alice", a.Operator)
	require.Equal(t, env.MessageID, a.MessageID)
	require.Contains(t, a.Note, "fixed the fold")
	require.Equal(t, "RESERVE_INVENTORY", a.To, "the replay itself changes no state")
	n := len(b.audit(t, id))

	// Again: idempotent.
	res = postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay",
		admin.ReplayRequest{Reason: "fixed the fold"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyReplay, res.Outcome)
	require.Equal(t, 1, b.outboxOf(t, env.MessageID).Count)
	require.Len(t, b.audit(t, id), n)

	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked").Items, "replayed rows leave the open list")
	all := getJSON[admin.ParkedPage](t, b, "/api/parked?include_replayed=true")
	require.Len(t, all.Items, 1)
	require.NotNil(t, all.Items[0].ReplayedAt)

	// The replayed message then takes the normal path: applied once.
	require.NoError(t, b.deliver(t, env, reply))
	require.Equal(t, "AUTHORIZE_PAYMENT", b.status(t, id).State)
}

func TestReplayRepublishesOutboxRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-republish")
	env := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-republish"})
	// The participant's reply went out through this database's outbox.
	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	require.NoError(t, outbox.Enqueue(t.Context(), tx, env))
	require.NoError(t, tx.Commit(t.Context()))
	b.markPublished(t, env.MessageID)
	pid := b.park(t, env, "order.saga.place_order", "boom")
	// A second subscriber of the same routing parked it too.
	other := b.park(t, env, "audit.replies", "boom")

	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(pid)+"/replay",
		admin.ReplayRequest{Reason: "retry after fix"}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, []int64{other}, res.AlsoMarked, "one publish reaches every bound queue")
	o := b.outboxOf(t, env.MessageID)
	require.Equal(t, 1, o.Count, "the original row is released, not copied")
	require.False(t, o.Published)
	require.True(t, o.Pending, "the released row is pending again")

	res = postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(other)+"/replay",
		admin.ReplayRequest{Reason: "retry after fix"}, http.StatusOK)
	require.Equal(t, admin.OutcomeAlreadyReplay, res.Outcome)
}

func TestReplayChecksSagaState(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// A reply whose outcome is already recorded: refused, nothing written.
	id := b.start(t, "order-applied")
	reply := &inventoryv1.InventoryReserved{OrderId: "order-applied"}
	env := b.replyEnvelope(t, id, reply)
	require.NoError(t, b.deliver(t, env, reply))
	dup := b.park(t, env, "order.saga.place_order", "a copy parked elsewhere")
	code, raw := b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(dup)+"/replay", admin.ReplayRequest{Reason: "try"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	e := apiError(t, raw)
	require.Equal(t, "refused", e.Code)
	require.Contains(t, e.Message, "already recorded")
	require.Equal(t, 0, b.outboxOf(t, env.MessageID).Count)
	require.Len(t, getJSON[admin.ParkedPage](t, b, "/api/parked").Items, 1, "still open")

	// Forced, it goes through the normal path (where it is a duplicate).
	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(dup)+"/replay",
		admin.ReplayRequest{Reason: "operator insists", Force: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.False(t, res.Check.Allowed)
	require.Contains(t, b.lastAudit(t, id).Note, "FORCED")
	v := b.status(t, id).Version
	require.NoError(t, b.deliver(t, env, reply))
	require.Equal(t, v, b.status(t, id).Version, "no second effect")

	// A command the saga no longer waits for.
	id2 := b.start(t, "order-stale")
	st := b.status(t, id2)
	var cmdEnv envelope.Envelope
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT message_id, message_type, exchange, routing_key, body FROM saga_outbox WHERE message_id = $1`,
		st.PendingMessageID).Scan(&cmdEnv.MessageID, &cmdEnv.MessageType, &cmdEnv.Exchange, &cmdEnv.RoutingKey, &cmdEnv.Body))
	cmdEnv.SagaID, cmdEnv.SagaType, cmdEnv.SchemaVersion = id2, st.Type, 1
	cmd := b.park(t, cmdEnv, "inventory.commands", "inventory DB down")
	dryCmd := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(cmd)+"/replay", admin.ReplayRequest{Reason: "r", DryRun: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeWouldReplay, dryCmd.Outcome, "the saga still waits on this command")
	b.clock.Advance(time.Minute)
	_, err := b.engine.FireTimeouts(t.Context(), 10) // the step times out and compensates
	require.NoError(t, err)
	code, raw = b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(cmd)+"/replay", admin.ReplayRequest{Reason: "r"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	require.Contains(t, apiError(t, raw).Message, "no longer waits for this command")

	// A message for a saga that does not exist.
	ghost := b.replyEnvelope(t, id2, &inventoryv1.InventoryReserved{OrderId: "ghost"})
	ghost.SagaID = newID()
	gid := b.park(t, ghost, "order.saga.place_order", "saga not found")
	code, raw = b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(gid)+"/replay", admin.ReplayRequest{Reason: "r"})
	require.Equal(t, http.StatusConflict, code, string(raw))
	require.Contains(t, apiError(t, raw).Message, "does not exist")

	// Bulk: a dry run over the saga's queue lists each verdict.
	bulk := postJSON[admin.BulkReplayResult](t, b, "/api/bulk/parked/replay",
		admin.BulkReplayRequest{Filter: admin.ParkedFilter{Queue: "order.saga.place_order"}, Reason: "sweep", DryRun: true}, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeRefused: 1}, bulk.Counts, "the ghost; the forced one is replayed already")
}
