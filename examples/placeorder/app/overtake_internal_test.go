package app

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/schema"
)

// TestReleaseOvertakingItsReservation: a saga compensates a step that
// stopped waiting (a timeout) because its effect may have happened; the
// compensation can then reach the participant before the command it undoes
// (that one still in a retry tier, or slow). The inventory's release of an
// order that holds nothing leaves a tombstone, and the reservation that
// arrives after it is refused: no stock is held for an order nobody will
// release again. Run through the generated handler, in real transactions.
func TestReleaseOvertakingItsReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, reg, stock := inventoryFixture(t, 5)
	_, h := inventoryv1.RegisterInventoryParticipant(&Inventory{reg: reg})
	sagaID := uuid.NewString()
	run := func(cmd message.Message) string {
		env, err := envelope.New(cmd, envelope.Meta{SagaID: sagaID})
		require.NoError(t, err)
		d := &consumer.Delivery{Envelope: env, Message: cmd, Queue: "inventory.commands", Attempt: 1}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h(ctx, tx, d) }))
		var reply string
		require.NoError(t, pool.QueryRow(ctx, `SELECT message_type FROM saga_outbox WHERE causation_id = $1`, env.MessageID).Scan(&reply))
		return reply
	}

	require.Equal(t, inventoryv1.InventoryReleasedInfo.FullName, run(&inventoryv1.ReleaseInventory{OrderId: "o-overtaken"}),
		"releasing nothing succeeds")
	require.Equal(t, inventoryv1.InventoryReservationFailedInfo.FullName, run(&inventoryv1.ReserveInventory{OrderId: "o-overtaken",
		Lines: []*commonv1.OrderLine{{ProductId: "widget", Quantity: 2}}}), "the overtaken reservation is refused")
	require.EqualValues(t, 5, stock(), "no stock held")
	rows, err := pool.Query(ctx, `SELECT effect FROM shop_ledger WHERE order_id = 'o-overtaken' ORDER BY id`)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"released_nothing", "reservation_refused"}, effects)
}

// inventoryFixture migrates a database of its own for the example's
// inventory, with available widgets in stock, and returns it, a registry of
// the inventory's messages, and a func that reads the widgets in stock.
func inventoryFixture(t *testing.T, available int32) (*pgxpool.Pool, *message.Registry, func() int32) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, participant.Migrations, Migrations()))
	reg, err := message.NewRegistry(inventoryv1.ReserveInventoryInfo, inventoryv1.InventoryReservedInfo,
		inventoryv1.InventoryReservationFailedInfo, inventoryv1.ReleaseInventoryInfo, inventoryv1.InventoryReleasedInfo)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO inventory_stock VALUES ('widget', $1)`, available)
	require.NoError(t, err)
	return pool, reg, func() (n int32) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT available FROM inventory_stock WHERE product_id = 'widget'`).Scan(&n))
		return n
	}
}
