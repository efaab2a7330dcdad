package saga_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestStuckRule: the rule's SQL (the gauge and the admin server's filter)
// and its Go verdict (the admin server's reason) agree, case by case: an
// overdue timeout or deadline counts once past the grace, as does no
// progress for longer than the step's timeout plus the grace; manual
// review and terminal states never count. A step whose child saga is in
// manual review counts at once, named in the reason.
func TestStuckRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	def := orderDefinition(t) // step timeout 10 s
	const grace = time.Minute
	rule := saga.NewStuckRule(def, grace)
	now := time.Now().UTC().Truncate(time.Microsecond)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }
	reserve, compensating := sagadef.StateName("Reserve"), sagadef.CompensatingStateName("Reserve")
	cases := []struct {
		name                string
		state               string
		timeoutAt, deadline *time.Time
		updatedAgo          time.Duration
		stuck               bool
		reason              string
		review              *sagadef.ChildReview
	}{
		{"waiting, on time", reserve, ago(-5 * time.Second), ago(-time.Hour), 5 * time.Second, false, "", nil},
		{"timeout overdue within the grace", reserve, ago(30 * time.Second), nil, 40 * time.Second, false, "", nil},
		{"timeout overdue past the grace", reserve, ago(61 * time.Second), nil, 40 * time.Second, true, "timeout due 1m1s ago", nil},
		{"deadline overdue past the grace", compensating, ago(-5 * time.Second), ago(2 * time.Minute), 5 * time.Second, true, "saga deadline passed 2m0s ago", nil},
		{"no progress within timeout + grace", reserve, ago(-time.Hour), nil, 69 * time.Second, false, "", nil},
		{"no progress past timeout + grace", compensating, ago(-time.Hour), nil, 71 * time.Second, true, "no progress for 1m11s; the step's timeout is 10s", nil},
		{"no timeout armed, no progress", reserve, nil, nil, 2 * time.Minute, true, "no progress for 2m0s", nil},
		{"manual review, everything overdue", sagadef.StateManualReview, ago(time.Hour), ago(time.Hour), time.Hour, false, "", nil},
		{"terminal", sagadef.StateCompleted, ago(time.Hour), nil, time.Hour, false, "", nil},
		{"child in manual review, on time", reserve, ago(-5 * time.Second), ago(-time.Hour), time.Second, true,
			"step Reserve waits on a child in manual review: shop.payment.v1.Payment 42 (business key pay-42): card declined",
			&sagadef.ChildReview{Step: "Reserve", Reason: "shop.payment.v1.Payment 42 (business key pay-42): card declined"}},
		{"child in manual review, timeout overdue", reserve, ago(time.Hour), nil, time.Hour, true,
			"step Reserve waits on a child in manual review: (the child gave no reason)", &sagadef.ChildReview{Step: "Reserve"}},
	}
	_, err := pool.Exec(ctx, `CREATE TABLE stuck_cases (id int PRIMARY KEY, state text NOT NULL,
	timeout_at timestamptz, deadline_at timestamptz, updated_at timestamptz NOT NULL, progress jsonb)`)
	require.NoError(t, err)
	for i, c := range cases {
		progress, err := json.Marshal(sagadef.Progress{ChildReview: c.review}) // as the engine stores it
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO stuck_cases VALUES ($1, $2, $3, $4, $5, $6::jsonb)`,
			i, c.state, c.timeoutAt, c.deadline, now.Add(-c.updatedAgo), string(progress))
		require.NoError(t, err)
	}
	states, limits, g := rule.Args()
	rows, err := pool.Query(ctx, `SELECT id FROM stuck_cases t WHERE `+saga.StuckSQL("$1", "$2", "$3", "$4")+` ORDER BY id`,
		now, states, limits, g)
	require.NoError(t, err)
	bySQL, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	for i, c := range cases {
		reason := rule.Reason(c.state, c.review, c.timeoutAt, c.deadline, now.Add(-c.updatedAgo), now)
		require.Equal(t, c.stuck, reason != "", "%s: Go verdict %q", c.name, reason)
		require.Equal(t, c.stuck, slices.Contains(bySQL, int32(i)), "%s: SQL verdict", c.name)
		require.Contains(t, reason, c.reason, c.name)
	}
}
