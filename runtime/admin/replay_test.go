package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/message"
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
	require.Equal(t, page, getJSON[admin.ParkedPage](t, b, "/api/parked?saga_id="+strings.ToUpper(id)),
		"the saga id filter reads ids as /api/sagas/{id} does, in any case")

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
	cmd, _ := b.parkPendingCommand(t, id2)
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

// parkPendingCommand parks the command saga id waits on (its outbox row),
// as the participant's consumer would, and returns the parked id and the
// command's envelope.
func (b *bundle) parkPendingCommand(t *testing.T, id string) (int64, message.Envelope) {
	t.Helper()
	st := b.status(t, id)
	var env message.Envelope
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT message_id, message_type, exchange, routing_key, body FROM saga_outbox WHERE message_id = $1`,
		st.PendingMessageID).Scan(&env.MessageID, &env.MessageType, &env.Exchange, &env.RoutingKey, &env.Body))
	env.SagaID, env.SagaType, env.SchemaVersion = id, st.Type, 1
	return b.park(t, env, "inventory.commands", "inventory DB down"), env
}

// TestReplayCheckHoldsUntilCommit: the saga-state check of a replay holds
// until the replay commits. Here the replay of a parked command is paused
// after its check (its outbox row is locked) while the step's timeout
// comes due: the timeout waits for the replay, which goes out while the
// saga still waits on that command. Never a replay audited as checked
// against a state the saga had already left.
func TestReplayCheckHoldsUntilCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-race")
	pid, cmd := b.parkPendingCommand(t, id)

	hold, holder := b.holdOutboxRow(t, cmd.MessageID)
	done := b.replayAsync(t, pid, "inventory DB back")
	b.awaitBlocked(t, holder, 1)

	b.clock.Advance(time.Minute) // the step's timeout is due
	fired, err := b.engine.FireTimeouts(t.Context(), 10)
	require.NoError(t, err)
	require.NoError(t, hold.Rollback(t.Context()))
	a := <-done

	// The replay holds the saga row from its check on, so the scanner
	// (SKIP LOCKED) passes the saga over until the replay has committed.
	require.Zero(t, fired, "the timeout fired while the replay held its check")
	require.Equal(t, http.StatusOK, a.code, string(a.raw))
	var res admin.ReplayResult
	require.NoError(t, json.Unmarshal(a.raw, &res))
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, "RESERVE_INVENTORY", res.Check.SagaState)
	note := b.lastAudit(t, id)
	require.Equal(t, admin.TriggerReplay, note.Trigger)
	require.Equal(t, res.Check.SagaState, note.To, "the audited check is the state the replay was recorded in")
	for _, h := range b.audit(t, id) {
		if h.Trigger == admin.TriggerReplay {
			require.Equal(t, "RESERVE_INVENTORY", h.To, "a replay recorded against a saga that had moved on")
		}
	}
}

// TestReplayDryRunLocksNothing: a dry run reads the saga without locking
// its row, so it answers while a live reply (here a transaction holding the
// row) works on the saga, and holds up nothing.
func TestReplayDryRunLocksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-dry")
	pid, _ := b.parkPendingCommand(t, id)

	hold, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	_, err = hold.Exec(t.Context(), `SELECT 1 FROM saga_place_order WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	code, raw := b.callCtx(ctx, t, repairToken, http.MethodPost, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: "look", DryRun: true})
	require.Equal(t, http.StatusOK, code, string(raw))
	var res admin.ReplayResult
	require.NoError(t, json.Unmarshal(raw, &res))
	require.Equal(t, admin.OutcomeWouldReplay, res.Outcome)
}

// holdOutboxRow locks the outbox row of messageID in a transaction the
// caller rolls back, and returns it with its backend pid: a replay of that
// message then waits at its republish.
func (b *bundle) holdOutboxRow(t *testing.T, messageID string) (pgx.Tx, int32) {
	t.Helper()
	hold, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	var holder int32
	require.NoError(t, hold.QueryRow(t.Context(), `SELECT pg_backend_pid() FROM saga_outbox WHERE message_id = $1 FOR UPDATE`,
		messageID).Scan(&holder))
	return hold, holder
}

// answer is an API answer's status and body.
type answer struct {
	code int
	raw  []byte
}

// replayAsync replays parked message pid in the background.
func (b *bundle) replayAsync(t *testing.T, pid int64, reason string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		code, raw := b.call(t, repairToken, http.MethodPost, "/api/parked/"+itoa(pid)+"/replay", admin.ReplayRequest{Reason: reason})
		done <- answer{code, raw}
	}()
	return done
}

// awaitBlocked waits until n sessions wait, directly or through each
// other, for the locks of session holder.
func (b *bundle) awaitBlocked(t *testing.T, holder int32, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, b.pool.QueryRow(t.Context(), `WITH RECURSIVE w(pid) AS (
  SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))
  UNION SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid)))
SELECT count(*) FROM w`, holder).Scan(&waiting))
		return waiting >= n
	}, 10*time.Second, 10*time.Millisecond, "%d session(s) never waited for the held lock", n)
}

// TestConcurrentReplaysOfSiblings: two operators replay the two parked
// rows of one message (two subscribers parked it) at the same time. One
// replays it, the other finds it replayed; neither gets an error.
func TestConcurrentReplaysOfSiblings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-siblings")
	env := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-siblings"})
	b.publishReply(t, env)
	b.markPublished(t, env.MessageID)
	first := b.park(t, env, "order.saga.place_order", "boom")
	second := b.park(t, env, "audit.replies", "boom")

	// Both replays start while the message's outbox row is held, so that
	// each has got as far as it goes before the other moves on.
	hold, holder := b.holdOutboxRow(t, env.MessageID)
	answers := []<-chan answer{b.replayAsync(t, second, "fixed"), b.replayAsync(t, first, "fixed")}
	b.awaitBlocked(t, holder, 2)
	require.NoError(t, hold.Rollback(t.Context()))

	outcomes := map[string]int{}
	for _, ch := range answers {
		a := <-ch
		require.Equal(t, http.StatusOK, a.code, string(a.raw))
		var res admin.ReplayResult
		require.NoError(t, json.Unmarshal(a.raw, &res))
		outcomes[res.Outcome]++
	}
	require.Equal(t, map[string]int{admin.OutcomeReplayed: 1, admin.OutcomeAlreadyReplay: 1}, outcomes)
	require.Equal(t, 1, b.outboxOf(t, env.MessageID).Count)
	require.Empty(t, getJSON[admin.ParkedPage](t, b, "/api/parked").Items)
}

// TestBulkReplayInParkingOrder: a bulk replay republishes the oldest parked
// messages first, in the order they were parked, and with max it takes the
// oldest.
func TestBulkReplayInParkingOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var parked []int64
	var messages []string
	for _, order := range []string{"order-a", "order-b", "order-c"} {
		id := b.start(t, order)
		env := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: order})
		parked = append(parked, b.park(t, env, "order.saga.place_order", "boom"))
		messages = append(messages, env.MessageID)
	}
	bulk := postJSON[admin.BulkReplayResult](t, b, "/api/bulk/parked/replay",
		admin.BulkReplayRequest{Filter: admin.ParkedFilter{Queue: "order.saga.place_order"}, Reason: "sweep", Max: 2}, http.StatusOK)
	require.True(t, bulk.Truncated)
	var got []int64
	for _, it := range bulk.Items {
		require.Equal(t, admin.OutcomeReplayed, it.Outcome, it.Check.Explanation)
		got = append(got, it.Parked.ID)
	}
	require.Equal(t, parked[:2], got, "the oldest, oldest first")
	var out []string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT array_agg(message_id ORDER BY id) FROM saga_outbox WHERE message_id = ANY($1)`,
		messages).Scan(&out))
	require.Equal(t, messages[:2], out, "republished in the order they were parked")
}

// TestParkedWithOddSagaIDs: a parked message names its saga id as its
// producer wrote it. One in upper case is joined to its saga; one in a form
// PostgreSQL does not read as a uuid (urn:uuid:...) is listed without its
// saga and refused for replay, and breaks neither the list, nor the single
// view, nor a bulk dry run.
func TestParkedWithOddSagaIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-odd")
	env := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-odd"})
	upper := env
	upper.SagaID = strings.ToUpper(id)
	up := b.park(t, upper, "order.saga.place_order", "boom")
	urn := env
	urn.SagaID = "urn:uuid:" + id
	odd := b.park(t, urn, "order.saga.place_order", "boom")

	page := getJSON[admin.ParkedPage](t, b, "/api/parked")
	require.Len(t, page.Items, 2)
	for _, p := range page.Items {
		switch p.ID {
		case up:
			require.Equal(t, "order-odd", p.BusinessKey, "joined on the canonical id")
		case odd:
			require.Empty(t, p.BusinessKey)
		}
	}
	p := getJSON[admin.Parked](t, b, "/api/parked/"+itoa(odd))
	require.Equal(t, urn.SagaID, p.SagaID, "shown as parked")
	require.Equal(t, "order-odd", getJSON[admin.Parked](t, b, "/api/parked/"+itoa(up)).BusinessKey)

	bulk := postJSON[admin.BulkReplayResult](t, b, "/api/bulk/parked/replay",
		admin.BulkReplayRequest{Filter: admin.ParkedFilter{Queue: "order.saga.place_order"}, Reason: "sweep", DryRun: true}, http.StatusOK)
	require.Equal(t, map[string]int{admin.OutcomeWouldReplay: 1, admin.OutcomeRefused: 1}, bulk.Counts)
	require.Contains(t, bulk.Items[1].Check.Explanation, "is not a UUID")
}

// TestReplayWithoutAuditTrailRecordsWhy: a replay that cannot be noted on a
// saga (the message names none, or its saga does not exist) records who,
// why and whether forced on the parked rows it marks.
func TestReplayWithoutAuditTrailRecordsWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-why")
	sagaless := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-why"})
	sagaless.SagaID, sagaless.SagaType, sagaless.CorrelationID = "", "", ""
	free := b.park(t, sagaless, "audit.replies", "no saga")
	ghost := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "ghost"})
	ghost.SagaID = newID()
	gid := b.park(t, ghost, "order.saga.place_order", "saga not found")
	sibling := b.park(t, ghost, "audit.replies", "saga not found")

	res := postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(free)+"/replay",
		admin.ReplayRequest{Reason: "audit consumer fixed"}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, "audit consumer fixed", res.Parked.ReplayReason)
	require.False(t, res.Parked.ReplayForced)
	res = postJSON[admin.ReplayResult](t, b, "/api/parked/"+itoa(gid)+"/replay",
		admin.ReplayRequest{Reason: "saga restored from backup", Force: true}, http.StatusOK)
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.True(t, res.Parked.ReplayForced)

	want := map[int64][3]any{
		free:    {"alice", "audit consumer fixed", false},
		gid:     {"alice", "saga restored from backup", true},
		sibling: {"alice", "saga restored from backup", true},
	}
	page := getJSON[admin.ParkedPage](t, b, "/api/parked?include_replayed=true")
	require.Len(t, page.Items, 3)
	for _, p := range page.Items {
		require.Equal(t, want[p.ID], [3]any{p.ReplayedBy, p.ReplayReason, p.ReplayForced}, "parked %d", p.ID)
	}
	one := getJSON[admin.Parked](t, b, "/api/parked/"+itoa(gid))
	require.Equal(t, "saga restored from backup", one.ReplayReason)
	require.True(t, one.ReplayForced)
}
