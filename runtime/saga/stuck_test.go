package saga_test

import (
	"context"
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
// review and terminal states never count.
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
	}{
		{"waiting, on time", reserve, ago(-5 * time.Second), ago(-time.Hour), 5 * time.Second, false, ""},
		{"timeout overdue within the grace", reserve, ago(30 * time.Second), nil, 40 * time.Second, false, ""},
		{"timeout overdue past the grace", reserve, ago(61 * time.Second), nil, 40 * time.Second, true, "timeout due 1m1s ago"},
		{"deadline overdue past the grace", compensating, ago(-5 * time.Second), ago(2 * time.Minute), 5 * time.Second, true, "saga deadline passed 2m0s ago"},
		{"no progress within timeout + grace", reserve, ago(-time.Hour), nil, 69 * time.Second, false, ""},
		{"no progress past timeout + grace", compensating, ago(-time.Hour), nil, 71 * time.Second, true, "no progress for 1m11s; the step's timeout is 10s"},
		{"no timeout armed, no progress", reserve, nil, nil, 2 * time.Minute, true, "no progress for 2m0s"},
		{"manual review, everything overdue", sagadef.StateManualReview, ago(time.Hour), ago(time.Hour), time.Hour, false, ""},
		{"terminal", sagadef.StateCompleted, ago(time.Hour), nil, time.Hour, false, ""},
	}
	_, err := pool.Exec(ctx, `CREATE TABLE stuck_cases (id int PRIMARY KEY, state text NOT NULL,
	timeout_at timestamptz, deadline_at timestamptz, updated_at timestamptz NOT NULL)`)
	require.NoError(t, err)
	for i, c := range cases {
		_, err := pool.Exec(ctx, `INSERT INTO stuck_cases VALUES ($1, $2, $3, $4, $5)`, i, c.state, c.timeoutAt, c.deadline, now.Add(-c.updatedAgo))
		require.NoError(t, err)
	}
	states, limits, g := rule.Args()
	rows, err := pool.Query(ctx, `SELECT id FROM stuck_cases t WHERE `+saga.StuckSQL("$1", "$2", "$3", "$4")+` ORDER BY id`,
		now, states, limits, g)
	require.NoError(t, err)
	bySQL, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	for i, c := range cases {
		reason := rule.Reason(c.state, c.timeoutAt, c.deadline, now.Add(-c.updatedAgo), now)
		require.Equal(t, c.stuck, reason != "", "%s: Go verdict %q", c.name, reason)
		require.Equal(t, c.stuck, slices.Contains(bySQL, int32(i)), "%s: SQL verdict", c.name)
		require.Contains(t, reason, c.reason, c.name)
	}
}
