package app

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/envelope"
)

// TestScriptAnswersAnOperatorRetry: an operator's retry
// (envelope.HeaderOperatorRetry) of a ReserveInventory whose first try was
// refused (out of stock) runs the reservation again under every wrapper of
// the example: the generated handler, and the Script's duplicate and hold
// paths (a.answer), which answered with the first try's stored refusal.
func TestScriptAnswersAnOperatorRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, reg, stock := inventoryFixture(t, 0)
	script := NewScript()
	a := &App{cfg: Config{Script: script}, reg: reg, inventory: &Inventory{reg: reg}}
	_, h := inventoryv1.RegisterInventoryParticipant(a.inventory)
	wrapped := a.scripted(h)

	delivery := func(order string, retry int) *consumer.Delivery {
		cmd := &inventoryv1.ReserveInventory{OrderId: order, Lines: []*commonv1.OrderLine{{ProductId: "widget", Quantity: 1}}}
		env, err := envelope.New(cmd, envelope.Meta{SagaID: uuid.NewString()})
		require.NoError(t, err)
		if retry > 0 {
			env.Headers = map[string]any{envelope.HeaderOperatorRetry: int64(retry)}
		}
		return &consumer.Delivery{Envelope: env, Message: cmd, Queue: "inventory.commands", Attempt: 1}
	}
	run := func(h consumer.HandlerFunc, d *consumer.Delivery) {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h(ctx, tx, d) }))
	}
	replies := func(d *consumer.Delivery) []string {
		rows, err := pool.Query(ctx, `SELECT message_type FROM saga_outbox WHERE causation_id = $1 ORDER BY id`, d.Envelope.MessageID)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}

	// Both orders are refused first (no stock), then stock arrives and the
	// operator retries.
	run(h, delivery("o-dup", 0))
	run(h, delivery("o-hold", 0))
	_, err := pool.Exec(ctx, `UPDATE inventory_stock SET available = 5`)
	require.NoError(t, err)

	// Duplicate replies: h answers the retry, then a.answer answers it "again".
	script.DuplicateReplies("o-dup", inventoryv1.ReserveInventoryInfo.FullName)
	dupRetry := delivery("o-dup", 1)
	run(wrapped, dupRetry)
	gotDup := replies(dupRetry)

	// Held replies: only a.answer runs.
	script.HoldReplies("o-hold", inventoryv1.ReserveInventoryInfo.FullName)
	holdRetry := delivery("o-hold", 1)
	run(wrapped, holdRetry)
	held, ok := script.take("o-hold")
	require.True(t, ok)
	require.EqualValues(t, 3, stock(), "each retry reserved one widget")

	require.Equal(t, []string{inventoryv1.InventoryReservedInfo.FullName, inventoryv1.InventoryReservedInfo.FullName}, gotDup,
		"the duplicate of the retry's reply must be the retry's reply")
	require.Equal(t, inventoryv1.InventoryReservedInfo.FullName, held.reply.SagaMessageInfo().FullName,
		"a held retry must run the reservation again")
}
