package admin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
)

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
		case []string:
			out[i] = testenv.ArrayLiteral(v...)
		default:
			t.Fatalf("argument %d: no literal for %T", i+1, a)
		}
	}
	return out
}

// TestListPlans lists a saga's parked messages from 20,000 of other sagas,
// half of them replayed, a fifth of them parked without a saga id: PostgreSQL's generic plan (the one a prepared
// statement settles on) goes through the index its filter names, instead
// of reading the table newest first until the page is full. (The saga
// lists are saga.Engine.List's; runtime/saga tests their plans.)
func TestListPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Every fifth one was parked without saga metadata.
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_parked (message_id, queue, message_type, saga_id, saga_type, correlation_key, class, reason,
  exchange, routing_key, attempts, headers, body, first_failure_at, replayed_at)
SELECT 'm-' || i, 'q-' || (i % 10), 't-' || (i % 10), CASE WHEN i % 5 = 0 THEN '' ELSE gen_random_uuid()::text END,
  CASE WHEN i % 5 = 0 THEN '' ELSE 'shop.order.v1.PlaceOrder' END, CASE WHEN i % 5 = 0 THEN 'order-' || i ELSE '' END, 'permanent', 'r', 'x', 'k',
  1, '{}', '\x', now(), CASE WHEN i % 2 = 0 THEN now() END
FROM generate_series(1, 20000) i;
ANALYZE saga_parked`)
	require.NoError(t, err)
	order := b.start(t, "order-1")

	for _, c := range []struct {
		name         string
		filter       admin.ParkedFilter
		correlations []string
		indexes      []string
	}{
		{"saga", admin.ParkedFilter{SagaID: order}, nil, []string{"saga_parked_saga"}},
		{"saga, replayed too", admin.ParkedFilter{SagaID: order, IncludeReplayed: true}, nil, []string{"saga_parked_saga"}},
		{"saga and its correlation ids", admin.ParkedFilter{SagaID: order}, []string{order, "order-1"}, []string{"saga_parked_saga", "saga_parked_unlinked"}},
	} {
		query, args := admin.ParkedListSQLForTest(c.filter, c.correlations, 51)
		plan := testenv.GenericPlan(t, b.pool, query, literals(t, args)...)
		for _, index := range c.indexes {
			require.Contains(t, plan, " "+index+" ", "%s: the parked list's generic plan:\n%s", c.name, plan)
		}
		require.NotContains(t, plan, "Seq Scan", "%s: the parked list's generic plan:\n%s", c.name, plan)
	}
}
