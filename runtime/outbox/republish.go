package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/envelope"
)

// Republish makes the relay publish env again, keeping its message id, in
// the caller's transaction: an operator's replay of a parked message. When the
// outbox already holds that message id (it was published from this database),
// its row is released — unpublished, unleased — rather than copied, so the
// message id stays unique in the outbox; a row not yet published is left as it
// is. Otherwise env is enqueued as a new row. Consumers' inboxes drop the
// replay of a message they already applied, so a replay never has a second
// effect.
func Republish(ctx context.Context, tx pgx.Tx, env envelope.Envelope) error {
	var published *time.Time
	err := tx.QueryRow(ctx, `SELECT published_at FROM saga_outbox WHERE message_id = $1 FOR UPDATE`, env.MessageID).Scan(&published)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Enqueue(ctx, tx, env)
	case err != nil:
		return fmt.Errorf("republish %s %s: find its outbox row: %w", env.MessageType, env.MessageID, err)
	case published == nil:
		return nil // not yet published: the relay will
	}
	if _, err := tx.Exec(ctx, `UPDATE saga_outbox SET published_at = NULL, lease_owner = NULL, lease_until = NULL
WHERE message_id = $1`, env.MessageID); err != nil {
		return fmt.Errorf("republish %s %s: release its outbox row: %w", env.MessageType, env.MessageID, err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, NotifyChannel); err != nil {
		return fmt.Errorf("republish %s %s: notify relays: %w", env.MessageType, env.MessageID, err)
	}
	return nil
}
