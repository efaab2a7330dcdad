package saga_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestSagaGaugePlan runs the saga gauges' query, which reads every
// in-flight instance at every scrape, on a table of 20,000 finished
// instances and 607 waiting ones: it counts them and the stuck ones per
// state, and PostgreSQL's generic plan for it (the one a prepared
// statement settles on) reads the waiting ones through the state index and
// evaluates the stuck rule as an expression of the row, without a subquery
// run once per instance.
func TestSagaGaugePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	def := orderDefinition(t) // step timeout 10 s
	testenv.CreateSagaTable(t, pool, def)
	reserve, charge := sagadef.StateName("Reserve"), sagadef.StateName("Charge")
	// Reserve: 300 on time; Charge: every third one without progress for
	// an hour (stuck), the others on time; 7 in manual review; 20,000
	// completed.
	_, err := pool.Exec(ctx, `INSERT INTO saga_tel_order (id, business_key, state, data, timeout_at, updated_at)
SELECT gen_random_uuid(), 'k-' || i, CASE WHEN i <= 300 THEN $1 WHEN i <= 600 THEN $2 WHEN i <= 607 THEN $3 ELSE $4 END, '\x',
  CASE WHEN i <= 607 THEN now() + interval '5 seconds' END,
  CASE WHEN i > 300 AND i <= 600 AND i % 3 = 0 THEN now() - interval '1 hour' ELSE now() END
FROM generate_series(1, 20607) i`, reserve, charge, sagadef.StateManualReview, sagadef.StateCompleted)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE saga_tel_order`)
	require.NoError(t, err)

	var counted []string
	for _, s := range def.States {
		if s.Kind != sagadef.StateKindTerminal {
			counted = append(counted, s.Name)
		}
	}
	states, limits, grace := saga.NewStuckRule(def, time.Minute).Args()
	gauge := saga.SagaGaugeSQLForTest("saga_tel_order", counted)

	limitText := make([]string, len(limits))
	for i, l := range limits {
		limitText[i] = strconv.FormatInt(l, 10)
	}
	plan := testenv.GenericPlan(t, pool, gauge, "'{"+strings.Join(states, ",")+"}'",
		"'{"+strings.Join(limitText, ",")+"}'", strconv.FormatInt(grace, 10))
	require.Contains(t, plan, "saga_tel_order_state", "the gauge's generic plan:\n%s", plan)
	require.NotContains(t, plan, "SubPlan", "the gauge's generic plan:\n%s", plan)
	require.NotContains(t, plan, "Function Scan", "the gauge's generic plan:\n%s", plan)

	rows, err := pool.Query(ctx, gauge, states, limits, grace)
	require.NoError(t, err)
	type count struct{ all, stuck int64 }
	got := map[string]count{}
	var (
		state      string
		all, stuck int64
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &all, &stuck}, func() error {
		got[state] = count{all, stuck}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, map[string]count{reserve: {300, 0}, charge: {300, 100}, sagadef.StateManualReview: {7, 0}}, got)
}

// orderDefinition is a two-step saga (Reserve, compensatable; Charge,
// pivot) on the table saga_tel_order, each step with a 10 s timeout: the
// stuck rule's and the gauge's cases are written against it.
func orderDefinition(t testing.TB) *sagadef.Definition {
	t.Helper()
	name := func(n string) string { return "tel.v1." + n }
	def := &sagadef.Definition{
		Name:         name("Order"),
		Table:        "saga_tel_order",
		StartMessage: name("PlaceOrder"),
		DataMessage:  "google.protobuf.Struct",
		Steps: []sagadef.Step{
			{
				Name: "Reserve", Role: sagadef.RoleCompensatable,
				Command: name("Reserve"), SuccessReplies: []string{name("Reserved")}, FailureReplies: []string{name("ReserveFailed")},
				Compensation: name("Release"), CompensationReply: name("Released"),
				Timeout: 10 * time.Second, OnTimeout: sagadef.TimeoutCompensate, MaxAttempts: 1, Late: sagadef.LateIgnore,
			},
			{
				Name: "Charge", Role: sagadef.RolePivot,
				Command: name("Charge"), SuccessReplies: []string{name("Charged")}, FailureReplies: []string{name("Declined")},
				Timeout: 10 * time.Second, OnTimeout: sagadef.TimeoutManualReview, MaxAttempts: 1, Late: sagadef.LateIgnore,
			},
		},
	}
	require.NoError(t, def.Compile())
	return def
}
