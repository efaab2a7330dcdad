package saga_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// orderState stands for a generated state type.
type orderState string

// TestList pages through instances newest first, by state, business key and
// time window, and refuses filters it cannot apply.
func TestList(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	var ids []string // oldest first
	for _, order := range []string{"o-1", "o-2", "o-3", "o-4", "o-5"} {
		ids = append(ids, b.start(t, order))
		b.clock.Advance(time.Second)
	}
	b.mustReply(t, ids[1], msgInventoryFailed) // FAILED
	b.clock.Advance(time.Second)
	b.mustReply(t, ids[3], msgInventoryReserved) // AUTHORIZE_PAYMENT

	page, err := b.engine.List(ctx, saga.ListFilter{Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[3]}, idsOf(page.Items))
	require.NotEmpty(t, page.NextCursor)
	page, err = b.engine.List(ctx, saga.ListFilter{Limit: 2, After: page.NextCursor})
	require.NoError(t, err)
	require.Equal(t, []string{ids[2], ids[1]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{Limit: 2, After: page.NextCursor})
	require.NoError(t, err)
	require.Equal(t, []string{ids[0]}, idsOf(page.Items))
	require.Empty(t, page.NextCursor, "the last page")
	page, err = b.engine.List(ctx, saga.ListFilter{Limit: 2, After: saga.CursorOf(b.status(t, ids[2]))})
	require.NoError(t, err)
	require.Equal(t, []string{ids[1], ids[0]}, idsOf(page.Items), "a cursor of any listed instance continues after it")

	page, err = b.engine.List(ctx, saga.ListFilter{States: []string{stReserve}})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[2], ids[0]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{States: []string{stFailed, stPayment}})
	require.NoError(t, err)
	require.Equal(t, []string{ids[3], ids[1]}, idsOf(page.Items))
	require.Equal(t, "o-4", page.Items[0].BusinessKey)
	require.Equal(t, []string{"InventoryReserved"}, applied(t, page.Items[0]), "with the saga data")

	page, err = b.engine.List(ctx, saga.ListFilter{BusinessKey: "o-3"})
	require.NoError(t, err)
	require.Equal(t, []string{ids[2]}, idsOf(page.Items))

	// Updated: o-1..o-5 at base+0..4s, o-2 again at +5s, o-4 at +6s.
	page, err = b.engine.List(ctx, saga.ListFilter{UpdatedAfter: baseTime.Add(4500 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, []string{ids[3], ids[1]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{UpdatedBefore: baseTime.Add(2 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, []string{ids[0]}, idsOf(page.Items), "strictly before")
	page, err = b.engine.List(ctx, saga.ListFilter{UpdatedAfter: baseTime, UpdatedBefore: baseTime.Add(5 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[2]}, idsOf(page.Items), "strictly after, strictly before")

	// Oldest first, paged the other way.
	page, err = b.engine.List(ctx, saga.ListFilter{Limit: 2, Oldest: true})
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{Limit: 2, Oldest: true, After: page.NextCursor})
	require.NoError(t, err)
	require.Equal(t, []string{ids[2], ids[3]}, idsOf(page.Items))

	// Business key prefix, byte for byte (LIKE's wildcards are plain text).
	other := b.start(t, "p%_-1")
	page, err = b.engine.List(ctx, saga.ListFilter{KeyPrefix: "o-"})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{KeyPrefix: "p%_"})
	require.NoError(t, err)
	require.Equal(t, []string{other}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{KeyPrefix: "p_"})
	require.NoError(t, err)
	require.Empty(t, page.Items)

	// Created: o-1..o-5 at base+0..4s.
	page, err = b.engine.List(ctx, saga.ListFilter{CreatedAfter: baseTime.Add(2500 * time.Millisecond), CreatedBefore: baseTime.Add(4 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, []string{ids[3]}, idsOf(page.Items), "strictly after, strictly before")

	// Stuck at base+30s: the 10 s step timeouts of those still waiting on
	// a step passed long ago.
	rule := saga.NewStuckRule(b.def, time.Second)
	page, err = b.engine.List(ctx, saga.ListFilter{Stuck: &rule, StuckAt: baseTime.Add(30 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, []string{other, ids[4], ids[3], ids[2], ids[0]}, idsOf(page.Items))
	page, err = b.engine.List(ctx, saga.ListFilter{Stuck: &rule, StuckAt: baseTime.Add(3 * time.Second)})
	require.NoError(t, err)
	require.Empty(t, page.Items)

	for _, f := range []saga.ListFilter{
		{States: []string{"NOT_A_STATE"}},
		{States: []string{"x') OR true --"}},
		{Limit: -1},
		{Limit: saga.MaxListLimit + 1},
		{After: "bm9wZQ"},
		{After: "%%"},
		{UpdatedAfter: baseTime, UpdatedBefore: baseTime},
		{CreatedAfter: baseTime.Add(time.Second), CreatedBefore: baseTime},
	} {
		_, err := b.engine.List(ctx, f)
		require.ErrorIs(t, err, saga.ErrInvalidFilter, "%+v", f)
	}
	require.NoError(t, saga.CheckCursor(""))
	require.ErrorIs(t, saga.CheckCursor("bm9wZQ"), saga.ErrInvalidFilter)
}

// literals writes a statement's arguments as SQL literals, for
// testenv.GenericPlan.
func literals(t *testing.T, args []any) []string {
	t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int:
			out[i] = fmt.Sprint(v)
		case time.Time:
			out[i] = "'" + v.Format(time.RFC3339Nano) + "'"
		default:
			t.Fatalf("argument %d: no literal for %T", i+1, a)
		}
	}
	return out
}

func idsOf(sts []saga.Status) []string {
	out := make([]string, len(sts))
	for i, s := range sts {
		out[i] = s.ID
	}
	return out
}

// TestListPlans: PostgreSQL's generic plan of a list by business key, and of
// one by a rare state, reads through the index its filter names, not the
// table newest first until the page is full.
func TestListPlans(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data, created_at)
SELECT gen_random_uuid(), 'done-' || i, 'COMPLETED', '\x', now() - i * interval '1 second'
FROM generate_series(1, 20000) i;
ANALYZE saga_place_order`)
	require.NoError(t, err)
	b.start(t, "order-1")
	for _, c := range []struct {
		name   string
		filter saga.ListFilter
		index  string
	}{
		{"business key", saga.ListFilter{BusinessKey: "order-1"}, "saga_place_order_business_key_key"},
		{"review", saga.ListFilter{States: []string{stManualReview}}, "saga_place_order_state"},
		{"review after a cursor", saga.ListFilter{States: []string{stManualReview}, After: saga.CursorOf(b.status(t, b.start(t, "order-2")))}, "saga_place_order_state"},
	} {
		sql, args, err := b.engine.ListSQLForTest(c.filter)
		require.NoError(t, err)
		plan := testenv.GenericPlan(t, b.pool, sql, literals(t, args)...)
		require.Contains(t, plan, " "+c.index+" ", "%s: the list's generic plan:\n%s", c.name, plan)
		require.NotContains(t, plan, "Seq Scan", "%s: the list's generic plan:\n%s", c.name, plan)
	}
}

// TestTypedReads: the generic helpers generated code calls return typed
// snapshots and pages.
func TestTypedReads(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{cancel: true})
	ctx := context.Background()
	id := b.start(t, "o-1")
	b.clock.Advance(time.Second)
	b.start(t, "o-2")
	b.mustReply(t, id, msgInventoryFailed)

	snap, err := saga.Get[orderState, *structpb.Struct](ctx, b.engine, "o-1")
	require.NoError(t, err)
	require.Equal(t, id, snap.ID)
	require.Equal(t, "o-1", snap.BusinessKey)
	require.Equal(t, orderState(stFailed), snap.State)
	require.True(t, snap.Terminal())
	require.Equal(t, "o-1", snap.Data.Fields["order"].GetStringValue())
	require.EqualValues(t, 2, snap.Version)
	require.Equal(t, "step ReserveInventory failed with InventoryFailed", snap.LastError)
	require.Nil(t, snap.Cancel)
	require.Equal(t, baseTime, snap.CreatedAt)

	byID, err := saga.GetByID[orderState, *structpb.Struct](ctx, b.engine, id)
	require.NoError(t, err)
	require.Equal(t, snap, byID)
	_, err = saga.Get[orderState, *structpb.Struct](ctx, b.engine, "o-none")
	require.ErrorIs(t, err, saga.ErrNotFound)
	_, err = saga.GetByID[orderState, *structpb.Struct](ctx, b.engine, "not-an-id")
	require.ErrorIs(t, err, saga.ErrNotFound)

	page, err := saga.List[orderState, *structpb.Struct](ctx, b.engine, saga.Filter[orderState]{States: []orderState{stReserve}})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, "o-2", page.Items[0].BusinessKey)
	require.Equal(t, orderState(stReserve), page.Items[0].State)
	require.False(t, page.Items[0].Terminal())
	page, err = saga.List[orderState, *structpb.Struct](ctx, b.engine, saga.Filter[orderState]{Limit: 1})
	require.NoError(t, err)
	require.Equal(t, "o-2", page.Items[0].BusinessKey)
	page, err = saga.List[orderState, *structpb.Struct](ctx, b.engine, saga.Filter[orderState]{Limit: 1, Cursor: page.NextCursor})
	require.NoError(t, err)
	require.Equal(t, "o-1", page.Items[0].BusinessKey)
	_, err = saga.List[orderState, *structpb.Struct](ctx, b.engine, saga.Filter[orderState]{States: []orderState{"NOPE"}})
	require.ErrorIs(t, err, saga.ErrInvalidFilter)

	// Unreadable data: the snapshot says so instead of failing.
	_, err = b.pool.Exec(ctx, `UPDATE saga_place_order SET data = '\xff' WHERE id = $1`, id)
	require.NoError(t, err)
	snap, err = saga.Get[orderState, *structpb.Struct](ctx, b.engine, "o-1")
	require.NoError(t, err)
	require.Nil(t, snap.Data)
	require.Contains(t, snap.DataError, "saga data cannot be decoded")
}

// TestPhase maps every kind of state to its coarse phase.
func TestPhase(t *testing.T) {
	t.Parallel()
	for state, want := range map[string]saga.Phase{
		stReserve: saga.PhaseRunning, stCompReserve: saga.PhaseRunning, "A_NEWER_RELEASES_STEP": saga.PhaseRunning,
		stManualReview: saga.PhaseManualReview, stCompleted: saga.PhaseCompleted, stFailed: saga.PhaseFailed, stCancelled: saga.PhaseCancelled,
	} {
		kind := sagadef.StateKindStep
		switch state {
		case stManualReview:
			kind = sagadef.StateKindManualReview
		case stCompleted, stFailed, stCancelled:
			kind = sagadef.StateKindTerminal
		case "A_NEWER_RELEASES_STEP":
			kind = sagadef.StateKindUnspecified
		}
		require.Equal(t, want, saga.Status{State: state, StateKind: kind}.Phase(), state)
	}
}

// TestIdents: instances named by id or by business key, with their state;
// a name that matches nothing returns nothing.
func TestIdents(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	one, two := b.start(t, "o-1"), b.start(t, "o-2")
	b.start(t, "o-3")
	got, err := b.engine.Idents(ctx, []string{one, newID()}, []string{"o-2", "o-none"})
	require.NoError(t, err)
	state := b.status(t, one).State
	require.ElementsMatch(t, []saga.Ident{{ID: one, BusinessKey: "o-1", State: state}, {ID: two, BusinessKey: "o-2", State: state}}, got)
	got, err = b.engine.Idents(ctx, nil, nil)
	require.NoError(t, err)
	require.Empty(t, got)
}
