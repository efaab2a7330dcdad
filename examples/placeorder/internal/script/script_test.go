package script_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/examples/placeorder/internal/script"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/schema"
)

// TestScriptAnswersAnOperatorRetry: an operator's retry
// (message.HeaderOperatorRetry) of a ReserveInventory whose first try was
// refused (out of stock) runs the reservation again through the script's
// duplicate and hold paths too: the script wraps the once-per-command guard
// the host puts around the participant, and its replies are the guard's.
func TestScriptAnswersAnOperatorRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, participant.Migrations, app.Migrations()))
	_, err := pool.Exec(ctx, `INSERT INTO inventory_stock VALUES ('widget', 0)`)
	require.NoError(t, err)
	pkg := inventoryv1.SagaPackage()
	reg, err := message.NewRegistry(pkg.Messages...)
	require.NoError(t, err)
	s := script.New()
	// As runtime/host composes a participant with a middleware.
	h := participant.Handler(s.Middleware("inventory",
		participant.Idempotent("inventory", reg, inventoryv1.InventoryParticipantFunc(app.Inventory{}))))

	delivery := func(order string, retry int) *consumer.Delivery {
		cmd := &inventoryv1.ReserveInventory{OrderId: order, Lines: []*commonv1.OrderLine{{ProductId: "widget", Quantity: 1}}}
		env, err := message.New(cmd, message.Meta{SagaID: uuid.NewString()})
		require.NoError(t, err)
		if retry > 0 {
			env.Headers = map[string]any{message.HeaderOperatorRetry: int64(retry)}
		}
		return &consumer.Delivery{Envelope: env, Message: cmd, Queue: "inventory.commands", Attempt: 1}
	}
	run := func(d *consumer.Delivery) {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h(ctx, tx, d) }))
	}
	replies := func(d *consumer.Delivery) []string {
		rows, err := pool.Query(ctx, `SELECT message_type FROM saga_outbox WHERE causation_id = $1 ORDER BY id`, d.Envelope.MessageID)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	stock := func() (n int32) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT available FROM inventory_stock WHERE product_id = 'widget'`).Scan(&n))
		return n
	}

	// Both orders are refused first (no stock), then stock arrives and the
	// operator retries.
	run(delivery("o-dup", 0))
	run(delivery("o-hold", 0))
	_, err = pool.Exec(ctx, `UPDATE inventory_stock SET available = 5`)
	require.NoError(t, err)

	s.DuplicateReplies("o-dup", inventoryv1.ReserveInventoryInfo.FullName)
	dupRetry := delivery("o-dup", 1)
	run(dupRetry)
	require.Equal(t, []string{inventoryv1.InventoryReservedInfo.FullName, inventoryv1.InventoryReservedInfo.FullName}, replies(dupRetry),
		"the duplicate of the retry's reply must be the retry's reply")

	s.HoldReplies("o-hold", inventoryv1.ReserveInventoryInfo.FullName)
	holdRetry := delivery("o-hold", 1)
	run(holdRetry)
	require.Empty(t, replies(holdRetry), "held")
	require.Equal(t, 1, s.Held("o-hold"))
	sent, err := s.SendHeldReply(ctx, pool, "o-hold")
	require.NoError(t, err)
	require.True(t, sent)
	require.Equal(t, []string{inventoryv1.InventoryReservedInfo.FullName}, replies(holdRetry), "a held retry ran the reservation again")
	require.EqualValues(t, 3, stock(), "each retry reserved one widget")
}
