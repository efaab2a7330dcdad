package saga_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// TestDueClaim runs the timeout scanner's claim on a table where nearly
// every instance waits far ahead, and 5,000 wait in manual review with
// their deadline passed: it takes exactly the instances whose step timeout
// or deadline is due, and PostgreSQL's generic plan for it (the one a
// prepared statement settles on) reads them through the due index, without
// reading the whole table or past the instances in review.
func TestDueClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	now := baseTime
	past, future := now.Add(-time.Second), now.Add(time.Hour)
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data, timeout_at, deadline_at)
SELECT gen_random_uuid(), 'waiting-' || i, $1, '\x', $2::timestamptz, CASE WHEN i % 3 = 0 THEN $2::timestamptz + interval '1 hour' END
FROM generate_series(1, 20000) i`, stShipping, future)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data, timeout_at, deadline_at)
SELECT gen_random_uuid(), 'in-review-' || i, 'MANUAL_REVIEW', '\x', NULL, $1::timestamptz
FROM generate_series(1, 5000) i`, past)
	require.NoError(t, err)
	cases := []struct {
		key               string
		state             string
		timeout, deadline *time.Time
		due               bool
	}{
		{"timeout-due", stShipping, &past, nil, true},
		{"deadline-due", stShipping, &future, &past, true},
		{"deadline-due-no-timeout", stShipping, nil, &past, true},
		{"both-due", stShipping, &past, &past, true},
		{"due-at-the-instant", stShipping, &now, nil, true},
		{"not-due", stShipping, &future, &future, false},
		{"no-clock", stShipping, nil, nil, false},
		{"due-in-an-ended-state", "COMPLETED", &past, nil, false},
		{"deadline-passed-in-review", "MANUAL_REVIEW", nil, &past, false},
	}
	want := map[string]bool{}
	for _, c := range cases {
		_, err := b.pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data, timeout_at, deadline_at)
VALUES (gen_random_uuid(), $1, $2, '\x', $3, $4)`, c.key, c.state, c.timeout, c.deadline)
		require.NoError(t, err, c.key)
		if c.due {
			want[c.key] = true
		}
	}
	_, err = b.pool.Exec(ctx, `ANALYZE saga_place_order`)
	require.NoError(t, err)

	claim := b.engine.ClaimDueSQLForTest()
	states := []string{stShipping}
	plan := testenv.GenericPlan(t, b.pool, claim, "'"+now.Format(time.RFC3339Nano)+"'", "100", testenv.ArrayLiteral(stShipping))
	require.Contains(t, plan, "Index Scan using saga_place_order_due_at on saga_place_order", "the claim's generic plan:\n%s", plan)
	// The index leaves out the instances in manual review, whose deadline
	// passed while they wait for an operator: the claim does not read
	// past them (one due row in an ended state is read and left).
	for _, m := range regexp.MustCompile(`Rows Removed by Filter: (\d+)`).FindAllStringSubmatch(plan, -1) {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		require.Less(t, n, 10, "the claim's generic plan:\n%s", plan)
	}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // it only locked rows
	rows, err := tx.Query(ctx, `SELECT business_key FROM (`+claim+`) AS claimed`, now, 100, states)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	got := map[string]bool{}
	for _, k := range keys {
		got[k] = true
	}
	require.Equal(t, want, got)
}
