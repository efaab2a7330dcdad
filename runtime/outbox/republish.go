package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
)

// Republish makes the relay publish env again, keeping its message id, in
// the caller's transaction: an operator's replay of a parked message. When the
// outbox already holds that message id (it was published from this database),
// its row is made pending again, unleased, rather than copied, so the
// message id stays unique in the outbox. A row still pending is made
// claimable at once under a new claim count: a relay may hold it, already
// published and confirmed but not yet settled, and that settle must not
// record the replay as sent (a relay publishing it for the first time then
// publishes it once more, which consumers' inboxes drop). Otherwise env is
// enqueued as a new row. Consumers' inboxes drop the replay of a message they
// already applied, so a replay never has a second effect.
func Republish(ctx context.Context, tx pgx.Tx, env message.Envelope) error {
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
	// Settles match a row's claim by its attempts (settleSQL): counting
	// one more makes every claim in flight stale. A row still pending keeps
	// its pending_since: it has waited that long; a row made pending again
	// below starts afresh (the default), so the backlog's age and the
	// publish delay count from the replay, not from the first publish.
	tag, err := tx.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1
WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("republish %s %s: release its pending outbox row %d: %w", env.MessageType, env.MessageID, id, err)
	}
	if tag.RowsAffected() == 0 {
		_, err = tx.Exec(ctx, `WITH sent AS (DELETE FROM saga_outbox_sent WHERE id = $1 RETURNING attempts)
INSERT INTO saga_outbox_pending (id, attempts) SELECT $1, coalesce((SELECT attempts FROM sent), 0)
ON CONFLICT (id) DO NOTHING`, id)
		if err != nil {
			return fmt.Errorf("republish %s %s: release its outbox row %d: %w", env.MessageType, env.MessageID, id, err)
		}
	}
	if txq.Wake(tx, NotifyChannel) {
		return nil // the transaction's owner notifies after the commit
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, NotifyChannel); err != nil {
		return fmt.Errorf("republish %s %s: notify relays: %w", env.MessageType, env.MessageID, err)
	}
	return nil
}
