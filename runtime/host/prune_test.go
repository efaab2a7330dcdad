package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/schema"
)

// TestHostPrunesOnceRecords: a participant's queue keeps no inbox claims
// (its once records drop redeliveries), so its host prunes the service's
// once records older than KeepClaims instead, when the consumer starts and
// then every prune interval: another service's records and recent ones
// stay.
func TestHostPrunesOnceRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, participant.Migrations))
	_, err := pool.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key, first_at)
SELECT s, k || i, now() - CASE k WHEN 'old-' THEN interval '2 hours' ELSE interval '1 minute' END
FROM unnest(ARRAY['inventory', 'payment']) s, unnest(ARRAY['old-', 'new-']) k, generate_series(1, 3) i`)
	require.NoError(t, err)

	h, err := host.New(ctx, host.Config{Service: "inventory", Pool: pool, AMQPURL: testenv.AMQP(t), HTTPAddr: host.HTTPOff,
		KeepClaims: time.Hour})
	require.NoError(t, err)
	require.NoError(t, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
	require.NoError(t, h.Start(ctx))
	defer func() { require.NoError(t, h.Stop(ctx)) }()

	left := func() (keys []string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(array_agg(service || '/' || idempotency_key ORDER BY service, idempotency_key), '{}')
FROM saga_participant_once`).Scan(&keys))
		return keys
	}
	require.Eventually(t, func() bool { return len(left()) == 9 }, 30*time.Second, 20*time.Millisecond,
		"the inventory service's old once records were not pruned: %v", left())
	require.Equal(t, []string{"inventory/new-1", "inventory/new-2", "inventory/new-3",
		"payment/new-1", "payment/new-2", "payment/new-3", "payment/old-1", "payment/old-2", "payment/old-3"}, left())
}
