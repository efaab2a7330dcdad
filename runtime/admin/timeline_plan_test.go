package admin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
)

// TestTimelineOutboxPlan reads one saga's messages from an outbox of
// 20,000 rows of other sagas (and rows of no saga): it finds exactly that
// saga's, newest first, and PostgreSQL's generic plan for the read (the
// one a prepared statement settles on) goes through the saga_outbox_saga
// index instead of reading the whole outbox.
func TestTimelineOutboxPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, saga_id, body, occurred_at)
SELECT 'other-' || i, 'x', 'k', 't', 1, CASE WHEN i % 10 = 0 THEN '' ELSE gen_random_uuid()::text END, '\x', now()
FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	const sagaID = "0193f0c4-4c33-7a4e-9d2e-5f1b2c3d4e5f"
	_, err = b.pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, saga_id, body, occurred_at)
SELECT 'mine-' || i, 'x', 'k', 't', 1, $1, '\x', now() FROM generate_series(1, 3) i`, sagaID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `ANALYZE saga_outbox`)
	require.NoError(t, err)

	plan := testenv.GenericPlan(t, b.pool, admin.TimelineOutboxSQLForTest, "'"+sagaID+"'", "1001")
	require.Contains(t, plan, "using saga_outbox_saga on saga_outbox", "the timeline's generic plan:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on saga_outbox o", "the timeline's generic plan:\n%s", plan)

	rows, err := b.pool.Query(ctx, `SELECT message_id FROM (`+admin.TimelineOutboxSQLForTest+`) AS timeline`, sagaID, 1001)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"mine-3", "mine-2", "mine-1"}, ids)
}
