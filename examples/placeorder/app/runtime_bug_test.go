package app_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/schema"
)

// TestRuntimeBugIdempotentScopesByCommand shows a trap in
// runtime/participant.Idempotent, which this package sidesteps with one scope
// per command type (participants.go): Idempotent keys the stored effect on
// (service, idempotency key) only. The Place Order contract gives
// ReserveInventory and its compensation ReleaseInventory the same key (the
// order id) and the same owner, so a service that wraps its handler with
// Idempotent("inventory", ...) — as the generated interface's doc comment
// suggests — answers the release with the stored InventoryReserved and never
// releases anything. It should run the release (a different command) and
// answer InventoryReleased.
//
// This test fails until Idempotent (or Once) scopes its key by command type,
// or the design review refuses two commands of one owner sharing a key.
func TestRuntimeBugIdempotentScopesByCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, participant.Migrations))
	reg, err := message.NewRegistry(inventoryv1.InventoryReservedInfo, inventoryv1.InventoryReleasedInfo)
	require.NoError(t, err)
	var released int
	handle := participant.Idempotent("inventory", reg, func(_ context.Context, _ pgx.Tx, cmd message.Message) (message.Message, error) {
		switch c := cmd.(type) {
		case *inventoryv1.ReserveInventory:
			return &inventoryv1.InventoryReserved{OrderId: c.GetOrderId()}, nil
		case *inventoryv1.ReleaseInventory:
			released++
			return &inventoryv1.InventoryReleased{OrderId: c.GetOrderId()}, nil
		}
		return nil, nil
	})

	var reply message.Message
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := handle(ctx, tx, &inventoryv1.ReserveInventory{OrderId: "o-1"}); err != nil {
			return err
		}
		reply, err = handle(ctx, tx, &inventoryv1.ReleaseInventory{OrderId: "o-1"})
		return err
	}))
	require.Equal(t, 1, released, "the compensation must run")
	require.IsType(t, &inventoryv1.InventoryReleased{}, reply, "a release answered with the reservation's reply")
}
