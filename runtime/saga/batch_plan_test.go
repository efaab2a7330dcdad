package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
)

// TestBatchStatementsOnANewTable builds the generic plan (the one a
// prepared statement keeps) of the batch's instance lock while the instance
// table is new and has never been analyzed, as a service's first batches
// do: it must find its rows through the primary key, not sort a scan of the
// whole table. Then the batch's instance update runs, and each row gets the
// values of its own entry in the arrays; a row whose stored version is not
// the one given is left alone.
func TestBatchStatementsOnANewTable(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	ids := []string{b.start(t, "o-1"), b.start(t, "o-2"), b.start(t, "o-3")}
	plan := testenv.GenericPlan(t, b.pool, b.engine.LockManySQLForTest(), testenv.ArrayLiteral(ids[2], ids[0]))
	require.NotContains(t, plan, "Seq Scan on saga_place_order", "the batch lock's generic plan on a new table:\n%s", plan)
	require.Contains(t, plan, "saga_place_order_pkey", "the batch lock's generic plan on a new table:\n%s", plan)
	plan = testenv.GenericPlan(t, b.pool, b.engine.UpdateSQLForTest(), "'"+ids[0]+"'", "7", "'"+stPayment+"'", "8", `'\x00'`, "1",
		"''", "'{}'", "NULL", "NULL", "''", "''", "now()")
	require.NotContains(t, plan, "Seq Scan on saga_place_order", "a batch of one's update, generic plan on a new table:\n%s", plan)
	updateManyPlans(t, b, ids)

	// The ids in another order than the rows; o-1's stored version is
	// not 7, so it keeps its row.
	pending := newID()
	at := func(v string) *time.Time {
		tm, err := time.Parse(time.RFC3339, v)
		require.NoError(t, err)
		return &tm
	}
	tag, err := b.pool.Exec(ctx, b.engine.UpdateManySQLForTest(),
		[]string{ids[2], ids[0], ids[1]}, []int64{1, 7, 1},
		[]string{stCompleted, stPayment, stShipping}, []int64{2, 8, 2},
		[][]byte{{0x0c}, {0x0a}, {0x0b}}, []int32{3, 1, 2},
		[]string{"", "", pending}, []string{`{"c": 3}`, `{}`, `{"b": 2}`},
		[]*time.Time{nil, nil, at("2030-01-02T03:04:05Z")}, []*time.Time{at("2030-02-03T04:05:06Z"), nil, nil},
		[]string{"c failed", "", ""}, []string{"", "", "b reviewed"},
		[]time.Time{*at("2030-01-01T00:00:03Z"), *at("2030-01-01T00:00:01Z"), *at("2030-01-01T00:00:02Z")})
	require.NoError(t, err)
	require.EqualValues(t, 2, tag.RowsAffected())

	read := func(id string) stored {
		t.Helper()
		var s stored
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state, version, encode(data, 'hex'), attempt, coalesce(pending_message_id::text, '-'),
  coalesce(progress::text, '-'), timeout_at, deadline_at, coalesce(last_error, '-'), coalesce(review_reason, '-'), updated_at
FROM saga_place_order WHERE id = $1`, id).Scan(&s.state, &s.version, &s.data, &s.attempt, &s.pending,
			&s.progress, &s.timeout, &s.deadline, &s.lastError, &s.review, &s.updated))
		return s
	}
	before := b.status(t, ids[0])
	a := read(ids[0])
	require.Equal(t, before.State, a.state, "o-1 was updated though its stored version is not 7")
	require.EqualValues(t, 1, a.version)
	require.Equal(t, stored{state: stShipping, version: 2, data: "0b", attempt: 2, pending: pending, progress: `{"b": 2}`,
		timeout: at("2030-01-02T03:04:05Z"), lastError: "-", review: "b reviewed", updated: *at("2030-01-01T00:00:02Z")},
		utc(read(ids[1])), "o-2")
	require.Equal(t, stored{state: stCompleted, version: 2, data: "0c", attempt: 3, pending: "-", progress: `{"c": 3}`,
		deadline: at("2030-02-03T04:05:06Z"), lastError: "c failed", review: "-", updated: *at("2030-01-01T00:00:03Z")},
		utc(read(ids[2])), "o-3")
}

// stored is an instance row as the batch plan test reads it.
type stored struct {
	state, data, pending, progress, lastError, review string
	version, attempt                                  int64
	timeout, deadline                                 *time.Time
	updated                                           time.Time
}

// utc is s with its times in UTC, as the want values are.
func utc(s stored) stored {
	for _, p := range []**time.Time{&s.timeout, &s.deadline} {
		if *p != nil {
			u := (*p).UTC()
			*p = &u
		}
	}
	s.updated = s.updated.UTC()
	return s
}

// updateManyPlans builds the generic plan of the update of many instances
// on the new table as a batch sends it — after noSeqScanSQL, in the same
// transaction — and checks that it finds its rows through the primary key,
// not a scan of the whole table, and that the statement after it puts
// enable_seqscan back as it was, a SET LOCAL of the transaction's own
// included. Without the first statement the plan is a hash join over a
// sequential scan.
func updateManyPlans(t *testing.T, b *testBundle, ids []string) {
	t.Helper()
	ctx := context.Background()
	args := []string{testenv.ArrayLiteral(ids...), "'{7,7,7}'::int8[]", "'{" + stPayment + "," + stPayment + "," + stPayment + "}'::text[]",
		"'{8,8,8}'::int8[]", `'{"\\x00","\\x00","\\x00"}'::bytea[]`, "'{1,1,1}'::int4[]", `'{"","",""}'::text[]`, `'{"{}","{}","{}"}'::text[]`,
		"'{NULL,NULL,NULL}'::timestamptz[]", "'{NULL,NULL,NULL}'::timestamptz[]", `'{"","",""}'::text[]`, `'{"","",""}'::text[]`,
		"'{2030-01-01,2030-01-01,2030-01-01}'::timestamptz[]"}
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, before := range []string{"on", "off"} {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // ended below; this is for a failed check
		for _, sql := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "SET LOCAL enable_seqscan = " + before,
			saga.NoSeqScanSQLForTest, "PREPARE update_many AS " + b.engine.UpdateManySQLForTest()} {
			_, err = tx.Exec(ctx, sql)
			require.NoError(t, err, sql)
		}
		rows, err := tx.Query(ctx, "EXPLAIN ANALYZE EXECUTE update_many("+strings.Join(args, ", ")+")")
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "Seq Scan on saga_place_order", "the batch's update, generic plan on a new table:\n%s", plan)
		require.Contains(t, plan, "saga_place_order_pkey", "the batch's update, generic plan on a new table:\n%s", plan)
		_, err = tx.Exec(ctx, saga.RestoreSeqScanSQLForTest)
		require.NoError(t, err)
		var after string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&after))
		require.Equal(t, before, after, "enable_seqscan as the transaction had it")
		require.NoError(t, tx.Rollback(ctx))
		_, err = conn.Exec(ctx, "DEALLOCATE update_many") // PREPARE outlives the transaction
		require.NoError(t, err)
	}
}
