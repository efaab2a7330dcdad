package outbox

// Scheduled messages: an outbox row with a time before which it is not
// published. Such rows wait in saga_outbox_scheduled, not in saga_outbox,
// so the relay's claim and hand-off read only rows that are due and stay as
// they are for undelayed rows. MoveDue moves due rows into saga_outbox in
// one statement (insert there, delete here), which the relay then publishes
// like any other row: a scheduled message survives restarts in PostgreSQL,
// needs no broker plugin, and is moved, so published, once.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/message"
)

// Schedule wraps m in a new envelope (see message.New) and writes it in tx
// to be published at or after at. A type with a TimeToBeReceived has its
// expiry counted from at: a message scheduled for later does not expire
// before it is due. It returns the message id.
func Schedule(ctx context.Context, tx pgx.Tx, m message.Message, meta message.Meta, at time.Time) (messageID string, err error) {
	e, err := message.New(m, meta)
	if err != nil {
		return "", fmt.Errorf("schedule: %w", err)
	}
	if ttl := m.SagaMessageInfo().TimeToBeReceived; ttl > 0 && at.After(e.OccurredAt) {
		message.SetExpiry(&e, at.Add(ttl))
	}
	if err := ScheduleEnvelope(ctx, tx, e, at); err != nil {
		return "", err
	}
	return e.MessageID, nil
}

// ScheduleEnvelope writes env in tx to be published at or after at.
func ScheduleEnvelope(ctx context.Context, tx pgx.Tx, env message.Envelope, at time.Time) error {
	if at.IsZero() {
		return fmt.Errorf("schedule %s %s: no delivery time", env.MessageType, env.MessageID)
	}
	rs, err := newRowset([]message.Envelope{env})
	if err != nil {
		return fmt.Errorf("schedule %s: %w", env.MessageType, err)
	}
	args := append(rs.args(), at)
	if _, err := tx.Exec(ctx, scheduleSQL, args...); err != nil {
		return fmt.Errorf("schedule %s %s for %s: %w", env.MessageType, env.MessageID, at.UTC().Format(time.RFC3339), err)
	}
	return nil
}

const scheduleSQL = `
INSERT INTO saga_outbox_scheduled (message_id, exchange, routing_key, message_type, schema_version,
  correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
  headers, body, occurred_at, deliver_at)
SELECT m, x, k, t, v, co, ca, si, st, ik, tp, ts, h::jsonb, b, oa, $16
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[], $7::text[],
  $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bytea[], $15::timestamptz[])
  AS u(m, x, k, t, v, co, ca, si, st, ik, tp, ts, h, b, oa)`

// moveDueSQL moves at most $2 rows due at $1 into the outbox, earliest
// first, and wakes the relays when it moved any. Rows another mover has
// locked are skipped. A message id already in the outbox (scheduled twice
// by hand) is dropped here rather than failing the batch.
const moveDueSQL = `
WITH due AS (
  DELETE FROM saga_outbox_scheduled WHERE id IN (
    SELECT id FROM saga_outbox_scheduled WHERE deliver_at <= $1
    ORDER BY deliver_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
  RETURNING *
), ins AS (
  INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version,
    correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
    headers, body, occurred_at)
  SELECT message_id, exchange, routing_key, message_type, schema_version,
    correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
    headers, body, occurred_at
  FROM due ORDER BY deliver_at, id
  ON CONFLICT (message_id) DO NOTHING
  RETURNING 1
)
SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM ins),
  (SELECT count(*) FROM (SELECT pg_notify('` + NotifyChannel + `', '') FROM (SELECT FROM ins LIMIT 1) one) woken)`

// MoveDue moves at most limit scheduled messages due at now into the
// outbox, in one transaction, and returns how many rows it took (moved, or
// dropped as already in the outbox).
func MoveDue(ctx context.Context, pool *pgxpool.Pool, now time.Time, limit int) (int, error) {
	var due, inserted, woken int64
	if err := pool.QueryRow(ctx, moveDueSQL, now, limit).Scan(&due, &inserted, &woken); err != nil {
		return 0, fmt.Errorf("move scheduled messages due at %s into the outbox: %w", now.UTC().Format(time.RFC3339), err)
	}
	return int(due), nil
}

// SchedulerConfig configures [RunScheduler].
type SchedulerConfig struct {
	// Pool is the database of the outbox.
	Pool *pgxpool.Pool
	// Interval is how often due messages are looked for. Default 500ms:
	// a scheduled message is published up to about this much after it is
	// due.
	Interval time.Duration
	// BatchSize bounds the rows one statement moves. Default 500.
	BatchSize int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives failed moves. Default slog.Default().
	Logger *slog.Logger
}

// RunScheduler moves due scheduled messages into the outbox until ctx ends,
// every Interval (at once again while a batch was full). Any number of
// processes may run it on one database. A failed move is logged and tried
// again at the next tick; RunScheduler returns ctx's error.
func RunScheduler(ctx context.Context, cfg SchedulerConfig) error {
	if cfg.Pool == nil {
		return errors.New("outbox scheduler: no pool")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		n, err := MoveDue(ctx, cfg.Pool, cfg.Now(), cfg.BatchSize)
		if err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("outbox scheduler: moving due messages failed; trying again", "error", err)
		}
		if err == nil && n == cfg.BatchSize {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
