package outbox

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/schema"
)

// TestClaimPlanOnANewTable builds the claim's generic plan (the one a
// prepared statement keeps) while saga_outbox is new and has never been
// analyzed, as a relay's first claims do, and runs it once the outbox holds
// thousands of rows: it must read each claimed row's message through the
// primary key, not hash-join the claim against the whole outbox.
func TestClaimPlanOnANewTable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))

	for i := range 3 {
		_, err := pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
VALUES ($1, 'x', 'k', 't', 1, '\x', now())`, fmt.Sprint("first-", i))
		require.NoError(t, err)
	}
	plan := testenv.GenericPlan(t, pool, claimSQL, "'r1'", "60000", "64")
	require.Contains(t, plan, "saga_outbox_pkey", "the claim's generic plan on a new table:\n%s", plan)

	// The outbox grows, still never analyzed: a generic plan built now (a
	// relay connection opened later) looks the messages up by id too.
	// Claimed rows are leased for a minute: this claim takes new ones.
	_, err := pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
SELECT 'm-' || i, 'x', 'k', 't', 1, '\x', now() FROM generate_series(1, 5000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM saga_outbox_pending WHERE id > (SELECT min(id) + 100 FROM saga_outbox_pending)`)
	require.NoError(t, err)
	plan = testenv.GenericPlan(t, pool, claimSQL, "'r1'", "60000", "64")
	require.NotRegexp(t, `Seq Scan on saga_outbox\s`, plan, "the claim's generic plan:\n%s", plan)
	require.Contains(t, plan, "Index Scan using saga_outbox_pkey on saga_outbox", "the claim's generic plan:\n%s", plan)
}
