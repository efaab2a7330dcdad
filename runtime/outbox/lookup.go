package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier runs the outbox's reads: a transaction, a connection or a pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Written is what the outbox recorded about one message it took: its type
// and the saga it belongs to (empty for a message outside any saga).
type Written struct {
	MessageID   string
	MessageType string
	SagaID      string
	SagaType    string
}

// Lookup returns the outbox's record of the message with id messageID, read
// with q; ok is false when this database's outbox holds none (never written
// here, or pruned after it was published). The saga engine uses it to say
// whose command a misaddressed reply names; the console, to find a saga by
// a message id.
func Lookup(ctx context.Context, q Querier, messageID string) (w Written, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT message_id, message_type, saga_id, saga_type FROM saga_outbox WHERE message_id = $1`,
		messageID).Scan(&w.MessageID, &w.MessageType, &w.SagaID, &w.SagaType)
	if errors.Is(err, pgx.ErrNoRows) {
		return Written{}, false, nil
	}
	if err != nil {
		return Written{}, false, fmt.Errorf("look up outbox message %s: %w", messageID, err)
	}
	return w, true, nil
}

// Trace returns the W3C trace context stored with the message with id
// messageID; ok is false when the outbox holds no such message.
func Trace(ctx context.Context, q Querier, messageID string) (traceparent, tracestate string, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT traceparent, tracestate FROM saga_outbox WHERE message_id = $1`, messageID).
		Scan(&traceparent, &tracestate)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("read the trace context of outbox message %s: %w", messageID, err)
	}
	return traceparent, tracestate, true, nil
}

// SagaMessage is a message the outbox holds for a saga, with its
// publishing state.
type SagaMessage struct {
	MessageID, MessageType, Exchange, RoutingKey, CausationID string
	Body                                                      []byte
	OccurredAt                                                time.Time
	PublishedAt                                               *time.Time // nil while it waits
	Attempts                                                  int
}

// sagaMessagesSQL reads the newest $2 outbox rows of saga $1 (a saga id,
// never empty). Its second condition, saga_id not empty, is the predicate
// of the saga_outbox_saga index (runtime migration 0003): without it, the
// generic plan of the statement, which cannot know that $1 is not empty,
// cannot use that partial index and reads the whole outbox instead of the
// saga's few index entries.
const sagaMessagesSQL = `SELECT o.message_id, o.message_type, o.exchange, o.routing_key, o.causation_id,
	o.body, o.occurred_at, s.published_at, coalesce(p.attempts, s.attempts, o.attempts)
FROM saga_outbox o LEFT JOIN saga_outbox_sent s ON s.id = o.id LEFT JOIN saga_outbox_pending p ON p.id = o.id
WHERE o.saga_id = $1 AND o.saga_id <> '' ORDER BY o.id DESC LIMIT $2`

// SagaMessages returns the newest limit messages the outbox holds for saga
// sagaID, newest first.
func SagaMessages(ctx context.Context, q Querier, sagaID string, limit int) ([]SagaMessage, error) {
	rows, err := q.Query(ctx, sagaMessagesSQL, sagaID, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox messages of saga %s: %w", sagaID, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[SagaMessage])
	if err != nil {
		return nil, fmt.Errorf("outbox messages of saga %s: %w", sagaID, err)
	}
	return out, nil
}
