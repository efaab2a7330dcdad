package participant_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
)

// TestTypedNilReplyIsRefused: a typed participant method that returns a nil
// pointer as its reply with a nil error (Go's nil-interface mistake) is
// refused like a nil reply, not sent as an empty success reply.
func TestTypedNilReplyIsRefused(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	var typedNil *inventoryv1.InventoryReserved // e.g. a variable never assigned on one path
	fn := func(context.Context, pgx.Tx, *inventoryv1.ReserveInventory) (inventoryv1.ReserveInventoryResult, error) {
		return typedNil, nil
	}
	handler := participant.Handler(func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		return participant.Reply(fn(ctx, tx, &inventoryv1.ReserveInventory{OrderId: "o-1"}))
	})
	err := run(ctx, pool, handler, command(t, "o-1"))
	require.ErrorContains(t, err, "the handler returned neither a reply nor an error")
	require.Empty(t, outbox(t, pool), "a typed nil reply went out as an empty InventoryReserved")
}

// TestReplyEnvelopeRefusesNil: ReplyEnvelope, exported for replies sent
// later, answers a nil reply (or a nil pointer in one) with an error, not a
// panic.
func TestReplyEnvelopeRefusesNil(t *testing.T) {
	d := command(t, "o-1")
	var typedNil *inventoryv1.InventoryReserved
	for _, reply := range []message.Message{nil, typedNil} {
		require.NotPanics(t, func() {
			_, err := participant.ReplyEnvelope(&d.Envelope, reply)
			require.ErrorContains(t, err, "nil reply")
		})
	}
}
