package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/schema"
)

// TestSagaMessagesPlan reads one saga's messages from an outbox of 20,000
// rows of other sagas (and rows of no saga): it finds exactly that saga's,
// newest first, and PostgreSQL's generic plan for the read (the one a
// prepared statement settles on) goes through the saga_outbox_saga index
// instead of reading the whole outbox.
func TestSagaMessagesPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, saga_id, body, occurred_at)
SELECT 'other-' || i, 'x', 'k', 't', 1, CASE WHEN i % 10 = 0 THEN '' ELSE gen_random_uuid()::text END, '\x', now()
FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	const sagaID = "0193f0c4-4c33-7a4e-9d2e-5f1b2c3d4e5f"
	_, err = pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, saga_id, body, occurred_at)
SELECT 'mine-' || i, 'x', 'k', 't', 1, $1, '\x', now() FROM generate_series(1, 3) i`, sagaID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE saga_outbox`)
	require.NoError(t, err)

	plan := testenv.GenericPlan(t, pool, sagaMessagesSQL, "'"+sagaID+"'", "1001")
	require.Contains(t, plan, "using saga_outbox_saga on saga_outbox", "the generic plan:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on saga_outbox o", "the generic plan:\n%s", plan)

	msgs, err := SagaMessages(ctx, pool, sagaID, 1001)
	require.NoError(t, err)
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.MessageID)
		require.Nil(t, m.PublishedAt, "%s waits to be published", m.MessageID)
	}
	require.Equal(t, []string{"mine-3", "mine-2", "mine-1"}, ids)
}
