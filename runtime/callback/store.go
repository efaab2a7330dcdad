package callback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Status is a delivery's standing.
type Status string

// Delivery statuses.
const (
	StatusPending   Status = "pending"
	StatusDelivered Status = "delivered"
	StatusParked    Status = "parked"
)

// Record is one saga_callback row as operators see it.
type Record struct {
	ID, SagaID, SagaType, Event string
	URL, Client                 string
	Status                      Status
	Attempts                    int
	LastStatus                  int
	LastError                   string
	ParkReason                  string
	CreatedAt                   time.Time
	NextAttemptAt               time.Time
	DeliveredAt, ParkedAt       *time.Time
	Body                        []byte
}

// Filter selects deliveries for [List]. The zero value lists every
// delivery, newest first, up to Limit.
type Filter struct {
	SagaID string
	Status Status // "": any
	Limit  int    // default 100, at most 1000
}

const recordColumns = `id::text, saga_id, saga_type, event, url, client, attempts, last_status, last_error, park_reason,
  created_at, next_attempt_at, delivered_at, parked_at, body`

// List returns deliveries matching f, newest first.
func List(ctx context.Context, pool *pgxpool.Pool, f Filter) ([]Record, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	var where []string
	var args []any
	if f.SagaID != "" {
		args = append(args, f.SagaID)
		where = append(where, fmt.Sprintf("saga_id = $%d", len(args)))
	}
	switch f.Status {
	case "":
	case StatusPending:
		where = append(where, "delivered_at IS NULL AND parked_at IS NULL")
	case StatusDelivered:
		where = append(where, "delivered_at IS NOT NULL")
	case StatusParked:
		where = append(where, "parked_at IS NOT NULL AND delivered_at IS NULL")
	default:
		return nil, fmt.Errorf("list callbacks: unknown status %q (want pending, delivered or parked)", f.Status)
	}
	q := "SELECT " + recordColumns + " FROM saga_callback"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit)
	q += fmt.Sprintf(" ORDER BY created_at DESC, id LIMIT $%d", len(args))
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list callbacks (saga %q, status %q): %w", f.SagaID, f.Status, err)
	}
	out, err := pgx.CollectRows(rows, scanRecord)
	if err != nil {
		return nil, fmt.Errorf("list callbacks (saga %q, status %q): %w", f.SagaID, f.Status, err)
	}
	return out, nil
}

func scanRecord(r pgx.CollectableRow) (Record, error) {
	var c Record
	err := r.Scan(&c.ID, &c.SagaID, &c.SagaType, &c.Event, &c.URL, &c.Client, &c.Attempts, &c.LastStatus, &c.LastError,
		&c.ParkReason, &c.CreatedAt, &c.NextAttemptAt, &c.DeliveredAt, &c.ParkedAt, &c.Body)
	switch {
	case c.DeliveredAt != nil:
		c.Status = StatusDelivered
	case c.ParkedAt != nil:
		c.Status = StatusParked
	default:
		c.Status = StatusPending
	}
	return c, err
}

// Get returns one delivery by its callback id.
func Get(ctx context.Context, pool *pgxpool.Pool, id string) (Record, error) {
	rows, err := pool.Query(ctx, "SELECT "+recordColumns+" FROM saga_callback WHERE id::text = $1", id)
	if err != nil {
		return Record{}, fmt.Errorf("get callback %s: %w", id, err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, scanRecord)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("get callback %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("get callback %s: %w", id, err)
	}
	return c, nil
}

// Errors matched by the errors of [Get] and [Replay].
var (
	ErrNotFound  = errors.New("callback not found")
	ErrNotParked = errors.New("callback is not parked")
)

// AuditEntry is one operator action on a delivery.
type AuditEntry struct {
	Action, Operator, Reason string
	At                       time.Time
}

// Audit returns the operator actions on a delivery, oldest first.
func Audit(ctx context.Context, pool *pgxpool.Pool, id string) ([]AuditEntry, error) {
	rows, err := pool.Query(ctx, `SELECT action, operator, reason, at FROM saga_callback_audit WHERE callback_id::text = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("audit of callback %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AuditEntry])
	if err != nil {
		return nil, fmt.Errorf("audit of callback %s: %w", id, err)
	}
	return out, nil
}

// Replay makes a parked delivery due again with a fresh retry budget (same
// id and body, so a receiver that did process it deduplicates), and records
// who asked and why. Operator and reason are required.
func Replay(ctx context.Context, pool *pgxpool.Pool, id, operator, reason string) error {
	if strings.TrimSpace(operator) == "" || strings.TrimSpace(reason) == "" {
		return fmt.Errorf("replay callback %s: operator and reason are required", id)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE saga_callback SET parked_at = NULL, park_reason = '', attempts = 0, budget_from = now(),
  next_attempt_at = now(), lease_owner = NULL, lease_until = NULL
WHERE id::text = $1 AND parked_at IS NOT NULL AND delivered_at IS NULL`, id)
		if err != nil {
			return fmt.Errorf("replay callback %s: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT true FROM saga_callback WHERE id::text = $1`, id).Scan(&exists); errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("replay callback %s: %w", id, ErrNotFound)
			} else if err != nil {
				return fmt.Errorf("replay callback %s: %w", id, err)
			}
			return fmt.Errorf("replay callback %s: %w", id, ErrNotParked)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO saga_callback_audit (callback_id, action, operator, reason) VALUES ($1::uuid, 'replay', $2, $3)`,
			id, operator, reason); err != nil {
			return fmt.Errorf("audit replay of callback %s: %w", id, err)
		}
		return nil
	})
}
