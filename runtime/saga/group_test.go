package saga_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// The second member of the test contract's parallel group.
var (
	msgReserveCredit  = newInfo("ReserveCredit", message.KindCommand)
	msgCreditReserved = newInfo("CreditReserved", message.KindReply)
	msgCreditRefused  = newInfo("CreditRefused", message.KindReply)
	msgReleaseCredit  = newInfo("ReleaseCredit", message.KindCommand)
	msgCreditReleased = newInfo("CreditReleased", message.KindReply)
)

const (
	stGroup        = "RESERVE_STOCK"
	stCompCredit   = "COMPENSATING_RESERVE_CREDIT"
	groupTimeout   = time.Minute
	creditAttempts = 2
)

// groupReserve makes ReserveInventory and a new compensatable step,
// ReserveCredit (which retries on timeout), the parallel group
// ReserveStock, before the pivot.
func groupReserve(def *sagadef.Definition) {
	credit := sagadef.Step{
		Name: "ReserveCredit", Role: sagadef.RoleCompensatable, Group: "ReserveStock",
		Command:           msgReserveCredit.FullName,
		SuccessReplies:    []string{msgCreditReserved.FullName},
		FailureReplies:    []string{msgCreditRefused.FullName},
		Compensation:      msgReleaseCredit.FullName,
		CompensationReply: msgCreditReleased.FullName,
		Timeout:           stepTimeout,
		OnTimeout:         sagadef.TimeoutRetry,
		MaxAttempts:       creditAttempts,
		Late:              sagadef.LateIgnore,
	}
	def.Steps[0].Group = "ReserveStock"
	def.Steps = append(def.Steps[:1], append([]sagadef.Step{credit}, def.Steps[1:]...)...)
	def.Groups = []sagadef.Group{{Name: "ReserveStock", Timeout: groupTimeout}}
}

// member returns the pending command id of a waiting member.
func member(t *testing.T, st saga.Status, step string) string {
	t.Helper()
	require.NotNil(t, st.Progress.Group, "saga %s in %s waits on no group", st.ID, st.State)
	for _, m := range st.Progress.Group.Members {
		if m.Step == step {
			return m.Pending
		}
	}
	t.Fatalf("saga %s: member %s is not waiting", st.ID, step)
	return ""
}

// replyMember delivers m in answer to the member's pending command.
func (b *testBundle) replyMember(t *testing.T, sagaID, step string, in *message.Info) saga.Status {
	t.Helper()
	st := b.status(t, sagaID)
	_, err := b.reply(t, sagaID, msg(in, st.BusinessKey), member(t, st, step))
	require.NoError(t, err)
	return b.status(t, sagaID)
}

// TestGroupDispatchesEveryMemberAndJoins: starting the saga writes both
// members' commands with the instance in one transaction; each reply is
// applied to its member; the last one moves the saga to the pivot.
func TestGroupDispatchesEveryMemberAndJoins(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{group: true})
	id := b.start(t, "group-1")
	st := b.status(t, id)
	require.Equal(t, stGroup, st.State)
	require.Empty(t, st.PendingMessageID)
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit"}, outboxTypes(b.outbox(t, id)))
	require.Equal(t, baseTime.Add(stepTimeout), st.TimeoutAt, "timeout_at is the earliest member deadline")

	// The engine restarts between the replies: the members' progress is
	// in the row.
	st = b.replyMember(t, id, "ReserveCredit", msgCreditReserved)
	require.Equal(t, stGroup, st.State)
	require.Len(t, st.Progress.Group.Members, 1)
	b.engine = b.newEngine(t, nil)
	st = b.replyMember(t, id, "ReserveInventory", msgInventoryReserved)
	require.Equal(t, stPayment, st.State)
	require.Nil(t, st.Progress.Group)
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
	require.Equal(t, []string{"CreditReserved", "InventoryReserved"}, applied(t, st))
}

// TestGroupMemberFailureCompensatesTheOthers: a member's failure stops the
// member still waiting, which is compensated (naming its command); its late
// success is audited per its late-reply policy; the saga ends FAILED.
func TestGroupMemberFailureCompensatesTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{group: true})
	id := b.start(t, "group-fail")
	st := b.status(t, id)
	inventoryCmd := member(t, st, "ReserveInventory")
	st = b.replyMember(t, id, "ReserveCredit", msgCreditRefused)
	require.Equal(t, stCompReserve, st.State)
	require.Equal(t, []string{"ReserveInventory"}, st.Progress.Stopped)
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit", "ReleaseInventory"}, outboxTypes(b.outbox(t, id)))

	_, err := b.reply(t, id, msg(msgInventoryReserved, "group-fail"), inventoryCmd)
	require.NoError(t, err)
	h := b.history(t, id)
	require.Equal(t, "InventoryReserved:late:"+stCompReserve+">"+stCompReserve, trail(h)[len(h)-1])

	st = b.mustReply(t, id, msgInventoryReleased)
	require.Equal(t, stFailed, st.State)
}

// TestGroupMemberTimeoutThroughTheScanner: the durable timeout scanner
// fires a member's timeout; a member that retries resends only its own
// command, and timeout_at moves to the next member deadline.
func TestGroupMemberTimeoutThroughTheScanner(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{group: true, reserveTimeout: sagadef.TimeoutRetry, reserveMax: 3})
	id := b.start(t, "group-timeout")
	b.replyMember(t, id, "ReserveInventory", msgInventoryReserved)
	first := member(t, b.status(t, id), "ReserveCredit")

	b.clock.Advance(stepTimeout + time.Second)
	n, err := b.engine.FireTimeouts(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st := b.status(t, id)
	require.Equal(t, stGroup, st.State)
	require.NotEqual(t, first, member(t, st, "ReserveCredit"))
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit", "ReserveCredit"}, outboxTypes(b.outbox(t, id)), "only the credit command is resent")
	require.Equal(t, b.clock.Now().Add(stepTimeout), st.TimeoutAt)

	// The credit's budget is spent at its next timeout: manual review;
	// an operator's retry resends only what still waits.
	b.clock.Advance(stepTimeout + time.Second)
	_, err = b.engine.FireTimeouts(context.Background(), 10)
	require.NoError(t, err)
	st = b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	st, err = b.engine.Retry(context.Background(), id, st.Version, "ops", "credit service is back")
	require.NoError(t, err)
	require.Equal(t, stGroup, st.State)
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit", "ReserveCredit", "ReserveCredit"}, outboxTypes(b.outbox(t, id)))
	st = b.replyMember(t, id, "ReserveCredit", msgCreditReserved)
	require.Equal(t, stPayment, st.State)
}

// TestGroupCrashPoints: a transition that does not commit (the process
// dies before the commit) leaves nothing behind, and the redelivery that
// follows applies once — when entering the group (both commands or none),
// at one member's reply, and during the group's compensation.
func TestGroupCrashPoints(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{group: true})
	ctx := context.Background()
	crash := func(f func(tx pgx.Tx) error) {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, f(tx))
		require.NoError(t, tx.Rollback(ctx)) // killed before the commit
	}
	start := msg(msgPlaceOrder, "group-crash")
	meta := message.Meta{MessageID: newID()}

	// Killed between writing the members' commands and committing them.
	crash(func(tx pgx.Tx) error {
		_, _, err := b.engine.StartTx(ctx, tx, start, meta)
		return err
	})
	var rows int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox`).Scan(&rows))
	require.Zero(t, rows, "none of the members' commands outlives the crash")
	id, created, err := b.engine.Start(ctx, start, meta)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit"}, outboxTypes(b.outbox(t, id)))

	// Killed after one member's reply was applied, before the commit: the
	// redelivered reply is applied once.
	st := b.status(t, id)
	reply := msg(msgCreditReserved, "group-crash")
	env, err := message.New(reply, message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: member(t, st, "ReserveCredit")})
	require.NoError(t, err)
	d := &consumer.Delivery{Envelope: env, Message: reply, Queue: "test.replies", Attempt: 1, ReceivedAt: time.Now()}
	crash(func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) })
	require.Len(t, b.status(t, id).Progress.Group.Members, 2)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) }))
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) }))
	st = b.status(t, id)
	require.Equal(t, []string{"CreditReserved"}, applied(t, st), "the redelivery had no second effect")
	require.Len(t, st.Progress.Group.Members, 1)

	// The group's timeout starts compensation; killed while writing the
	// first compensation, then again while the second is written.
	b.clock.Advance(groupTimeout + time.Second)
	crash(func(tx pgx.Tx) error {
		_, err := b.engine.OperateTx(ctx, tx, saga.Operation{SagaID: id, Trigger: sagadef.TriggerOperatorCompensate,
			ExpectedVersion: st.Version, Operator: "ops", Reason: "customer gave up"})
		return err
	})
	require.Equal(t, stGroup, b.status(t, id).State)
	n, err := b.engine.FireTimeouts(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st = b.status(t, id)
	// The inventory member, still waiting, stopped; the credit completed:
	// compensated in reverse contract order, credit first.
	require.Equal(t, stCompCredit, st.State)
	require.Equal(t, []string{"ReserveInventory"}, st.Progress.Stopped)
	released := msg(msgCreditReleased, "group-crash")
	env, err = message.New(released, message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: st.PendingMessageID})
	require.NoError(t, err)
	d = &consumer.Delivery{Envelope: env, Message: released, Queue: "test.replies", Attempt: 1, ReceivedAt: time.Now()}
	crash(func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) })
	require.Equal(t, stCompCredit, b.status(t, id).State)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.engine.Handle(ctx, tx, d) }))
	st = b.status(t, id)
	require.Equal(t, stCompReserve, st.State)
	st = b.mustReply(t, id, msgInventoryReleased)
	require.Equal(t, stFailed, st.State)
	types := outboxTypes(b.outbox(t, id))
	require.Equal(t, []string{"ReserveInventory", "ReserveCredit", "ReleaseCredit", "ReleaseInventory"}, types)
	require.Equal(t, 1, countOf(types, "ReleaseCredit"), "each compensation written once")
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestGroupStuckRuleWatchesTheGroupState: the stuck rule watches a
// group's state; its members have none of their own.
func TestGroupStuckRuleWatchesTheGroupState(t *testing.T) {
	t.Parallel()
	def := placeOrder(t, "saga_group_stuck", defOptions{group: true})
	r := saga.NewStuckRule(def, time.Second)
	require.True(t, r.Waits(stGroup))
	require.False(t, r.Waits("RESERVE_CREDIT"))
	require.True(t, r.Waits(stCompCredit))
}

// TestGroupCommandsPublishedByTheNextRelay: the process that entered the
// group dies after the commit and before its relay published anything; a
// relay started afterwards publishes both members' commands, once each.
func TestGroupCommandsPublishedByTheNextRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{group: true})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	id := b.start(t, "group-relay") // committed; no relay ran

	quiet := slog.New(slog.DiscardHandler)
	conn, err := broker.Dial(ctx, testenv.AMQP(t), broker.ConnConfig{Name: "publish", MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	const sink = "test.group.sink"
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: msgReserveInventory.Exchange, Kind: "direct"}},
		Queues:    []broker.Queue{{Name: sink}},
	}
	for _, in := range []*message.Info{msgReserveInventory, msgReserveCredit} {
		top.Bindings = append(top.Bindings, broker.Binding{Queue: sink, Exchange: in.Exchange, RoutingKey: in.RoutingKey})
	}
	require.NoError(t, broker.Declare(ctx, ch, top))

	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: conn, PollInterval: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var published []string
	deadline := time.Now().Add(30 * time.Second)
	for len(published) < 2 && time.Now().Before(deadline) {
		d, ok, err := ch.Get(sink, true)
		require.NoError(t, err)
		if !ok {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		require.Equal(t, id, d.Headers[message.HeaderSagaID])
		published = append(published, d.Type)
	}
	require.ElementsMatch(t, []string{msgReserveInventory.FullName, msgReserveCredit.FullName}, published)
	// Nothing is published twice: every row is marked once confirmed.
	require.Eventually(t, func() bool {
		var pending int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox o JOIN saga_outbox_pending p ON p.id = o.id WHERE o.saga_id = $1`, id).Scan(&pending))
		return pending == 0
	}, 30*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	_, more, err := ch.Get(sink, true)
	require.NoError(t, err)
	require.False(t, more, "a member's command was published twice")
}
