package parked_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/schema"
)

func setup(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	return ctx, pool
}

func insert(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n parked.New) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return parked.Insert(ctx, tx, n) }))
}

func msg(id, queue string) parked.New {
	return parked.New{
		MessageID: id, Queue: queue, MessageType: "shop.v1.Reserve", SagaID: "saga-" + id, SagaType: "shop.v1.PlaceOrder",
		CorrelationID: "corr-" + id, Class: "permanent", Reason: "Decode Failed: bad payload", Attempts: 1,
		Exchange: "shop.v1.commands", RoutingKey: "command.shop.reserve", Headers: []byte(`{"x-saga-step":"Reserve"}`),
		FirstFailureAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

func ids(rs []parked.Row) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// TestInsertKeepsOneOpenRowPerMessageAndQueue: a redelivered message parked
// again from the same queue keeps its one open row; once that row is
// replayed (or dismissed), parking it again records a new one; the same
// message parked from another queue is its own row. Every column written
// reads back as written, a nil body as an empty one.
func TestInsertKeepsOneOpenRowPerMessageAndQueue(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	first := msg("m-1", "inventory")
	insert(t, ctx, pool, first)
	again := first
	again.Attempts, again.Reason = 4, "a later reason"
	insert(t, ctx, pool, again)
	insert(t, ctx, pool, msg("m-1", "payment"))

	rows, err := parked.Select(ctx, pool, `ORDER BY id`)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	r := rows[0]
	require.Equal(t, "inventory", r.Queue)
	require.Equal(t, 1, r.Attempts, "the redelivery left the open row as it was")
	require.Equal(t, "Decode Failed: bad payload", r.Reason)
	require.Equal(t, []byte{}, r.Body)
	require.JSONEq(t, `{"x-saga-step":"Reserve"}`, string(r.Headers))
	require.Equal(t, first.FirstFailureAt, r.FirstFailureAt)
	require.Equal(t, time.UTC, r.ParkedAt.Location())
	require.True(t, r.Open())
	require.Equal(t, "payment", rows[1].Queue)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := parked.MarkReplayed(ctx, tx, parked.Routing{MessageID: "m-1", Exchange: first.Exchange, RoutingKey: first.RoutingKey},
			time.Now(), "alice", "fixed the decoder", false)
		return err
	})
	require.NoError(t, err)
	insert(t, ctx, pool, again)
	open, err := parked.CountOpen(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"inventory": 1}, open, "the replay closed the payment queue's row too: one message, one routing")
	all, err := parked.Select(ctx, pool, `WHERE queue = 'inventory' ORDER BY id`)
	require.NoError(t, err)
	require.Len(t, all, 2, "a message parked again after its replay is a new row")
	require.False(t, all[0].Open())
	require.Equal(t, 4, all[1].Attempts)
}

// TestReplayClosesEveryOpenSiblingAndNothingElse: one message parked by
// several subscribers' queues is one routing; LockSiblings returns its open
// rows (and the row asked for, even closed), MarkReplayed closes exactly
// those with who, why and whether forced, and returns their ids; a row of
// another message or routing stays open.
func TestReplayClosesEveryOpenSiblingAndNothingElse(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	a, b := msg("ev-1", "billing.events.shop"), msg("ev-1", "mail.events.shop")
	other := msg("ev-2", "billing.events.shop")
	elsewhere := msg("ev-1", "audit.events.shop")
	elsewhere.RoutingKey = "event.shop.other"
	for _, n := range []parked.New{a, b, other, elsewhere} {
		insert(t, ctx, pool, n)
	}
	rows, err := parked.Select(ctx, pool, `ORDER BY id`)
	require.NoError(t, err)
	require.Len(t, rows, 4)
	routing := parked.Routing{MessageID: "ev-1", Exchange: a.Exchange, RoutingKey: a.RoutingKey}

	var replayed []int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		sib, err := parked.LockSiblings(ctx, tx, rows[1].ID, routing)
		if err != nil {
			return err
		}
		require.Equal(t, []int64{rows[0].ID, rows[1].ID}, ids(sib))
		replayed, err = parked.MarkReplayed(ctx, tx, routing, time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC), "bob", "handler fixed", true)
		return err
	})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{rows[0].ID, rows[1].ID}, replayed)

	r, ok, err := parked.Get(ctx, pool, rows[0].ID, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, r.Open())
	require.Equal(t, "bob", r.ReplayedBy)
	require.Equal(t, "handler fixed", r.ReplayReason)
	require.True(t, r.ReplayForced)
	require.Equal(t, time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC), *r.ReplayedAt)
	for _, id := range []int64{rows[2].ID, rows[3].ID} {
		r, _, err := parked.Get(ctx, pool, id, false)
		require.NoError(t, err)
		require.True(t, r.Open(), "row %d is another message or routing", id)
	}

	// The replayed row asked for again comes back, closed, with no open
	// sibling; a second replay closes nothing.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		sib, err := parked.LockSiblings(ctx, tx, rows[0].ID, routing)
		if err != nil {
			return err
		}
		require.Equal(t, []int64{rows[0].ID}, ids(sib))
		again, err := parked.MarkReplayed(ctx, tx, routing, time.Now(), "bob", "again", false)
		require.Empty(t, again)
		return err
	})
	require.NoError(t, err)

	_, ok, err = parked.Get(ctx, pool, 1<<40, true)
	require.NoError(t, err)
	require.False(t, ok, "no such row")
}

// TestDismissAndCounts: a dismissed row is closed with who and why; the
// open count leaves out queues with nothing open, the per-queue count keeps
// them at 0.
func TestDismissAndCounts(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	insert(t, ctx, pool, msg("m-1", "inventory"))
	insert(t, ctx, pool, msg("m-2", "inventory"))
	insert(t, ctx, pool, msg("m-3", "payment"))
	rows, err := parked.Select(ctx, pool, `WHERE queue = 'payment'`)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return parked.MarkDismissed(ctx, tx, rows[0].ID, time.Now(), "carol", "the saga resent it")
	}))
	r, _, err := parked.Get(ctx, pool, rows[0].ID, false)
	require.NoError(t, err)
	require.False(t, r.Open())
	require.Equal(t, "carol", r.DismissedBy)
	require.Equal(t, "the saga resent it", r.DismissReason)

	open, err := parked.CountOpen(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"inventory": 2}, open)
	byQueue, err := parked.CountByQueue(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"inventory": 2, "payment": 0}, byQueue)
}

// TestListFilters runs ListSQL's clause for each filter against rows that
// differ in one way each, and the saga and search clauses: each returns
// exactly the rows it names, in the order asked, paged by id.
func TestListFilters(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	base := msg("m-1", "inventory")
	otherType := msg("m-2", "inventory")
	otherType.SagaType, otherType.MessageType = "shop.v1.Refund", "shop.v1.Refund"
	otherQueue := msg("m-3", "payment")
	otherReason := msg("m-4", "inventory")
	otherReason.Reason = "Retry budget EXHAUSTED after 3 attempts"
	unlinked := msg("m-5", "inventory")
	unlinked.SagaID, unlinked.SagaType, unlinked.CorrelationKey = "", "", "order-9"
	closed := msg("m-6", "inventory")
	for _, n := range []parked.New{base, otherType, otherQueue, otherReason, unlinked, closed} {
		insert(t, ctx, pool, n)
	}
	all, err := parked.Select(ctx, pool, `ORDER BY id`)
	require.NoError(t, err)
	require.Len(t, all, 6)
	id := func(i int) int64 { return all[i].ID }
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return parked.MarkDismissed(ctx, tx, id(5), time.Now(), "carol", "stale")
	}))

	list := func(f parked.Filter, order parked.Order, before int64, limit int) []int64 {
		t.Helper()
		clause, args := parked.ListSQL(f, order, before, limit)
		rs, err := parked.Select(ctx, pool, clause, args...)
		require.NoError(t, err, "clause %s", clause)
		return ids(rs)
	}
	require.Equal(t, []int64{id(4), id(3), id(2), id(1), id(0)}, list(parked.Filter{}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(0), id(1), id(2), id(3), id(4), id(5)}, list(parked.Filter{IncludeClosed: true}, parked.OldestFirst, 0, 50))
	require.Equal(t, []int64{id(1)}, list(parked.Filter{SagaType: "shop.v1.Refund"}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(1)}, list(parked.Filter{MessageType: "shop.v1.Refund"}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(2)}, list(parked.Filter{Queue: "payment"}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(3)}, list(parked.Filter{Reason: "budget exhausted"}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(0)}, list(parked.Filter{SagaID: "saga-m-1"}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(4), id(0)}, list(parked.Filter{SagaID: "saga-m-1", Correlations: []string{"saga-m-1", "order-9"}}, parked.NewestFirst, 0, 50))
	require.Equal(t, []int64{id(2), id(1)}, list(parked.Filter{}, parked.NewestFirst, id(3), 2), "a page below id(3), two long")
	require.Empty(t, list(parked.Filter{OlderThan: time.Hour}, parked.NewestFirst, 0, 50))
	require.Len(t, list(parked.Filter{NewerThan: time.Hour}, parked.NewestFirst, 0, 50), 5)

	rs, err := parked.Select(ctx, pool, parked.BySaga, "saga-m-1", 10, []string{"saga-m-1", "order-9"})
	require.NoError(t, err)
	require.Equal(t, []int64{id(4), id(0)}, ids(rs))
	rs, err = parked.Select(ctx, pool, parked.Search, "corr-m-3", 10)
	require.NoError(t, err)
	require.Equal(t, []int64{id(2)}, ids(rs))
	rs, err = parked.Select(ctx, pool, parked.Search, "order-9", 10)
	require.NoError(t, err)
	require.Equal(t, []int64{id(4)}, ids(rs))
}
