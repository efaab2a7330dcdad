package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/envelope"
)

// Republish makes the relay publish env again, keeping its message id, in
// the caller's transaction: an operator's replay of a parked message. When the
// outbox already holds that message id (it was published from this database),
// its row is made pending again, unleased, rather than copied, so the
// message id stays unique in the outbox; a row not yet published is left as it
// is. Otherwise env is enqueued as a new row. Consumers' inboxes drop the
// replay of a message they already applied, so a replay never has a second
// effect.
func Republish(ctx context.Context, tx pgx.Tx, env envelope.Envelope) error {
	// The outbox row's lock serializes replays of one message; the pending
	// row's waits for a relay's settle in flight, so a row that settle is
	// recording as sent is released again rather than taken for pending.
	var id int64
	err := tx.QueryRow(ctx, `SELECT id FROM saga_outbox WHERE message_id = $1 FOR UPDATE`, env.MessageID).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Enqueue(ctx, tx, env)
	case err != nil:
		return fmt.Errorf("republish %s %s: find its outbox row: %w", env.MessageType, env.MessageID, err)
	}
	var pending bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM saga_outbox_pending WHERE id = $1 FOR UPDATE)`, id).Scan(&pending); err != nil {
		return fmt.Errorf("republish %s %s: read its outbox row %d: %w", env.MessageType, env.MessageID, id, err)
	}
	if pending {
		return nil // not yet published: the relay will
	}
	if _, err := tx.Exec(ctx, `WITH sent AS (DELETE FROM saga_outbox_sent WHERE id = $1 RETURNING attempts)
INSERT INTO saga_outbox_pending (id, attempts) SELECT $1, coalesce((SELECT attempts FROM sent), 0)
ON CONFLICT (id) DO NOTHING`, id); err != nil {
		return fmt.Errorf("republish %s %s: release its outbox row %d: %w", env.MessageType, env.MessageID, id, err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, NotifyChannel); err != nil {
		return fmt.Errorf("republish %s %s: notify relays: %w", env.MessageType, env.MessageID, err)
	}
	return nil
}
