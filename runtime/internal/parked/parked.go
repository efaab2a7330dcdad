// Package parked owns the statements of the saga_parked table, the record
// of every message a consumer parked: the consumer records a parked message
// ([Insert]) in the transaction of its batch; the admin server lists
// ([Select], [ListSQL]), loads ([Get], [LockSiblings]), counts
// ([CountOpen]), replays ([MarkReplayed]) and dismisses ([MarkDismissed])
// them; the outbox gauges count them per queue ([CountByQueue]). No other
// package writes SQL on the table.
package parked

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/internal/where"
)

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Row is a saga_parked row.
type Row struct {
	ID                                              int64
	MessageID, Queue, MessageType, SagaID, SagaType string
	CorrelationID, Class, Reason                    string
	Attempts                                        int
	Exchange, RoutingKey                            string
	Headers, Body                                   []byte
	FirstFailureAt, ParkedAt                        time.Time
	ReplayedAt                                      *time.Time
	ReplayedBy, ReplayReason                        string
	ReplayForced                                    bool
	DismissedAt                                     *time.Time
	DismissedBy, DismissReason                      string
	CorrelationKey                                  string // the message's correlation field, when it named no saga
}

// Open reports whether the row is neither replayed nor dismissed.
func (r Row) Open() bool { return r.ReplayedAt == nil && r.DismissedAt == nil }

const columns = `id, message_id, queue, message_type, saga_id, saga_type, correlation_id, class, reason,
	attempts, exchange, routing_key, headers, body, first_failure_at, parked_at, replayed_at, replayed_by,
	replay_reason, replay_forced, dismissed_at, dismissed_by, dismiss_reason, correlation_key`

// OpenSQL is the condition of an open parked row.
const OpenSQL = "replayed_at IS NULL AND dismissed_at IS NULL"

// SelectSQL is the start of a statement reading rows: append a clause.
const SelectSQL = `SELECT ` + columns + ` FROM saga_parked `

func scan(r pgx.CollectableRow) (Row, error) {
	var p Row
	err := r.Scan(&p.ID, &p.MessageID, &p.Queue, &p.MessageType, &p.SagaID, &p.SagaType, &p.CorrelationID,
		&p.Class, &p.Reason, &p.Attempts, &p.Exchange, &p.RoutingKey, &p.Headers, &p.Body,
		&p.FirstFailureAt, &p.ParkedAt, &p.ReplayedAt, &p.ReplayedBy, &p.ReplayReason, &p.ReplayForced,
		&p.DismissedAt, &p.DismissedBy, &p.DismissReason, &p.CorrelationKey)
	p.FirstFailureAt, p.ParkedAt, p.ReplayedAt, p.DismissedAt = p.FirstFailureAt.UTC(), p.ParkedAt.UTC(), utc(p.ReplayedAt), utc(p.DismissedAt)
	return p, err
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// Select runs SelectSQL + clause.
func Select(ctx context.Context, q Querier, clause string, args ...any) ([]Row, error) {
	rows, err := q.Query(ctx, SelectSQL+clause, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// Get returns row id (ok false when there is none), locked FOR UPDATE when
// lock is set.
func Get(ctx context.Context, q Querier, id int64, lock bool) (Row, bool, error) {
	clause := `WHERE id = $1`
	if lock {
		clause += ` FOR UPDATE`
	}
	ps, err := Select(ctx, q, clause, id)
	if err != nil || len(ps) == 0 {
		return Row{}, false, err
	}
	return ps[0], true, nil
}

// BySaga is the clause (ORDER BY, LIMIT $2) of the rows of saga $1, those
// parked naming no saga whose correlation field is one of $3 (text[]: the
// saga's id and business key) included.
var BySaga = `WHERE saga_id = $1 OR ` + unlinked("$3") + `
ORDER BY id DESC LIMIT $2`

// unlinked is the condition of the rows parked without a saga id whose
// correlation field is one of keys (an SQL text[] expression), read through
// the saga_parked_unlinked index.
func unlinked(keys string) string {
	return "(saga_id = '' AND correlation_key <> '' AND correlation_key = ANY(" + keys + "))"
}

// Search is the clause of the rows whose message id, correlation id or
// correlation field is $1, newest first, at most $2.
const Search = `WHERE message_id = $1 OR correlation_id = $1 OR correlation_key = $1 ORDER BY id DESC LIMIT $2`

// Routing names the rows of one message parked from one exchange and
// routing key (one message parked by several subscribers).
type Routing struct{ MessageID, Exchange, RoutingKey string }

// LockSiblings locks the rows of r that are still open, with row id itself,
// in id order, and returns them.
func LockSiblings(ctx context.Context, tx pgx.Tx, id int64, r Routing) ([]Row, error) {
	return Select(ctx, tx, `WHERE message_id = $1 AND exchange = $2 AND routing_key = $3 AND ((`+OpenSQL+`) OR id = $4)
ORDER BY id FOR UPDATE`, r.MessageID, r.Exchange, r.RoutingKey, id)
}

// MarkReplayed closes, as replayed by operator at now, every open row of
// r, and returns their ids.
func MarkReplayed(ctx context.Context, tx pgx.Tx, r Routing, now time.Time, operator, reason string, forced bool) ([]int64, error) {
	rs, err := tx.Query(ctx, `UPDATE saga_parked SET replayed_at = $2, replayed_by = $3, replay_reason = $6, replay_forced = $7
WHERE message_id = $1 AND exchange = $4 AND routing_key = $5 AND `+OpenSQL+` RETURNING id`,
		r.MessageID, now, operator, r.Exchange, r.RoutingKey, reason, forced)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, pgx.RowTo[int64])
}

// MarkDismissed closes row id as dismissed by operator at now.
func MarkDismissed(ctx context.Context, tx pgx.Tx, id int64, now time.Time, operator, reason string) error {
	_, err := tx.Exec(ctx, `UPDATE saga_parked SET dismissed_at = $2, dismissed_by = $3, dismiss_reason = $4 WHERE id = $1`,
		id, now, operator, reason)
	return err
}

// CountOpen returns the open rows per queue.
func CountOpen(ctx context.Context, q Querier) (map[string]int64, error) {
	return count(ctx, q, `SELECT queue, count(*) FROM saga_parked WHERE `+OpenSQL+` GROUP BY queue`)
}

// CountByQueue returns the open rows of every queue that has rows, open or
// not: a queue whose rows were all replayed or dismissed counts 0.
func CountByQueue(ctx context.Context, q Querier) (map[string]int64, error) {
	return count(ctx, q, `SELECT queue, count(*) FILTER (WHERE `+OpenSQL+`) FROM saga_parked GROUP BY queue`)
}

func count(ctx context.Context, q Querier, sql string) (map[string]int64, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("count parked messages: %w", err)
	}
	var (
		queue string
		n     int64
	)
	counts := map[string]int64{}
	if _, err := pgx.ForEachRow(rows, []any{&queue, &n}, func() error { counts[queue] = n; return nil }); err != nil {
		return nil, fmt.Errorf("count parked messages: %w", err)
	}
	return counts, nil
}

// New is what a consumer records of a message it parks.
type New struct {
	MessageID, Queue, MessageType, SagaID, SagaType, CorrelationID string
	Class, Reason                                                  string
	Attempts                                                       int
	Exchange, RoutingKey                                           string
	Headers, Body                                                  []byte
	FirstFailureAt                                                 time.Time
	CorrelationKey                                                 string
}

// Insert records n in tx, unless the same message parked from the same
// queue is still open (neither replayed nor dismissed since): a redelivery
// after a lost ack keeps one row. The caller makes the text storable.
func Insert(ctx context.Context, tx Execer, n New) error {
	body := n.Body
	if body == nil {
		body = []byte{}
	}
	_, err := tx.Exec(ctx, `
INSERT INTO saga_parked (message_id, queue, message_type, saga_id, saga_type, correlation_id,
  class, reason, attempts, exchange, routing_key, headers, body, first_failure_at, correlation_key)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15
WHERE NOT EXISTS (
  SELECT 1 FROM saga_parked WHERE message_id = $1 AND queue = $2 AND `+OpenSQL+`
)`, n.MessageID, n.Queue, n.MessageType, n.SagaID, n.SagaType, n.CorrelationID, n.Class, n.Reason, n.Attempts,
		n.Exchange, n.RoutingKey, n.Headers, body, n.FirstFailureAt, n.CorrelationKey)
	if err != nil {
		return fmt.Errorf("record parked message %s: %w", n.MessageID, err)
	}
	return nil
}

// Order is the order of a list of parked messages.
type Order string

// Orders.
const (
	NewestFirst Order = "DESC" // listing: what was parked last comes first
	OldestFirst Order = "ASC"  // replaying: messages go out again in the order they were parked
)

// Filter selects parked messages for [ListSQL].
type Filter struct {
	IncludeClosed                bool // replayed and dismissed rows too
	SagaType, Queue, MessageType string
	SagaID                       string
	Correlations                 []string // with SagaID: the correlation fields of its messages parked naming no saga
	Reason                       string   // a case-insensitive part of the reason
	OlderThan, NewerThan         time.Duration
}

// ListSQL is the clause selecting at most limit rows matching f, in order,
// with ids below before (0: from the newest), and its arguments.
func ListSQL(f Filter, order Order, before int64, limit int) (string, []any) {
	var w where.Clause
	if !f.IncludeClosed {
		w.And(OpenSQL)
	}
	for _, c := range []struct{ column, v string }{
		{"saga_type", f.SagaType}, {"queue", f.Queue}, {"message_type", f.MessageType},
	} {
		if c.v != "" {
			w.And(c.column + " = " + w.Arg(c.v))
		}
	}
	if f.SagaID != "" {
		if len(f.Correlations) > 0 {
			w.And("(saga_id = " + w.Arg(f.SagaID) + " OR " + unlinked(w.Arg(f.Correlations)) + ")")
		} else {
			w.And("saga_id = " + w.Arg(f.SagaID))
		}
	}
	if f.Reason != "" {
		w.And("strpos(lower(reason), lower(" + w.Arg(f.Reason) + ")) > 0")
	}
	if f.OlderThan > 0 {
		w.And("parked_at < now() - make_interval(secs => " + w.Arg(f.OlderThan.Seconds()) + ")")
	}
	if f.NewerThan > 0 {
		w.And("parked_at > now() - make_interval(secs => " + w.Arg(f.NewerThan.Seconds()) + ")")
	}
	if before != 0 {
		w.And("id < " + w.Arg(before))
	}
	return w.String() + `
ORDER BY id ` + string(order) + ` LIMIT ` + w.Arg(limit), w.Args
}
