package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Written is what the outbox recorded about one message it took: its type
// and the saga it belongs to (empty for a message outside any saga).
type Written struct {
	MessageID   string
	MessageType string
	SagaID      string
	SagaType    string
}

// Lookup returns the outbox's record of the message with id messageID, read
// in tx; ok is false when this database's outbox holds none (never written
// here, or pruned after it was published). The saga engine uses it to say
// whose command a misaddressed reply names.
func Lookup(ctx context.Context, tx pgx.Tx, messageID string) (w Written, ok bool, err error) {
	err = tx.QueryRow(ctx, `SELECT message_id, message_type, saga_id, saga_type FROM saga_outbox WHERE message_id = $1`,
		messageID).Scan(&w.MessageID, &w.MessageType, &w.SagaID, &w.SagaType)
	if errors.Is(err, pgx.ErrNoRows) {
		return Written{}, false, nil
	}
	if err != nil {
		return Written{}, false, fmt.Errorf("look up outbox message %s: %w", messageID, err)
	}
	return w, true, nil
}
