// Package txq saves database round trips on the runtime's hot path in two
// ways, both carried in a context so the code that writes does not need to
// know who owns the transaction:
//
//   - A [Scope] queues writes whose results nobody reads before the handler
//     returns (the saga row update, its audit row, outbox rows, a
//     participant's stored reply) and sends them as one pipeline on
//     [Scope.Flush]. Without a scope in the context, [Exec] runs the
//     statement at once, as usual.
//   - [Wakes] collects the notifications a transaction would send (the
//     outbox's relay wake-up) so that its owner sends them after COMMIT
//     instead of inside the transaction. A NOTIFY inside a transaction
//     takes a cluster-wide lock that is held through the commit's WAL
//     flush, so concurrent committers queue behind each other instead of
//     sharing one flush.
//
// A scope or wake set applies only to the transaction it was made for: a
// handler that opens a transaction of its own (or a savepoint) with the same
// context writes there immediately, as if neither existed.
package txq

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Result receives the outcome of one statement (its error nil on success)
// and returns the error to report for it, or nil.
type Result func(tag pgconn.CommandTag, err error) error

// Scope queues the writes of one handler invocation on one transaction.
type Scope struct {
	tx      pgx.Tx
	batch   pgx.Batch
	results []Result
}

type scopeKey struct{}

// WithScope returns a context whose [Exec] calls on tx are queued in the
// returned scope. The caller owns the scope: it must call Flush before
// anything reads what the queued statements write, and before committing.
func WithScope(ctx context.Context, tx pgx.Tx) (context.Context, *Scope) {
	s := &Scope{tx: tx}
	return context.WithValue(ctx, scopeKey{}, s), s
}

// Open returns the scope ctx carries for tx, or a new one owned by the
// caller (owned = true: the caller flushes it).
func Open(ctx context.Context, tx pgx.Tx) (_ context.Context, s *Scope, owned bool) {
	if s, ok := ctx.Value(scopeKey{}).(*Scope); ok && s.tx == tx {
		return ctx, s, false
	}
	ctx, s = WithScope(ctx, tx)
	return ctx, s, true
}

// Exec runs sql on tx, or queues it when ctx carries a scope for tx. result
// (nil: report the statement's own error) sees the outcome either way: now,
// or when the scope is flushed; a queued statement's error is returned by
// Flush.
func Exec(ctx context.Context, tx pgx.Tx, result Result, sql string, args ...any) error {
	if result == nil {
		result = passError
	}
	if s, ok := ctx.Value(scopeKey{}).(*Scope); ok && s.tx == tx {
		s.batch.Queue(sql, args...)
		s.results = append(s.results, result)
		return nil
	}
	tag, err := tx.Exec(ctx, sql, args...)
	return result(tag, err)
}

// Sync sends what ctx's scope for tx has queued (nothing when there is no
// scope or it is empty), so that a following read sees it. The runtime calls
// it before reading a table it may have queued writes for.
func Sync(ctx context.Context, tx pgx.Tx) error {
	if s, ok := ctx.Value(scopeKey{}).(*Scope); ok && s.tx == tx {
		return s.Flush(ctx)
	}
	return nil
}

func passError(_ pgconn.CommandTag, err error) error { return err }

// Discard drops the queued statements without sending them (the handler
// failed), passing err to their Results so nothing is left waiting.
func (s *Scope) Discard(err error) {
	for _, r := range s.results {
		_ = r(pgconn.CommandTag{}, err)
	}
	s.results, s.batch = nil, pgx.Batch{}
}

// Len is the number of queued statements.
func (s *Scope) Len() int { return len(s.results) }

// Flush sends the queued statements as one pipeline and reports the first
// error among their results. Every statement's Result is called, in order,
// also those after a failure (with the error the server or the driver gave
// them), so none is left waiting. The scope is empty afterwards either way.
func (s *Scope) Flush(ctx context.Context) error {
	if len(s.results) == 0 {
		return nil
	}
	results := s.results
	batch := s.batch
	s.results, s.batch = nil, pgx.Batch{}
	br := s.tx.SendBatch(ctx, &batch)
	var first error
	for _, r := range results {
		tag, err := br.Exec()
		if err != nil && first != nil {
			err = fmt.Errorf("not applied after an earlier statement failed: %w", err)
		}
		if e := r(tag, err); e != nil && first == nil {
			first = e
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Wakes collects notification channels to signal after a transaction
// commits.
type Wakes struct {
	conn     *pgx.Conn
	channels []string
}

type wakesKey struct{}

// NewWakes returns an empty wake set for tx. In a context it is attached to
// (Attach), [Wake] for tx — or any savepoint of it: they share its
// connection — records the channel in the set instead of notifying inside
// the transaction. After a successful commit the owner calls Send.
func NewWakes(tx pgx.Tx) *Wakes {
	return &Wakes{conn: tx.Conn()}
}

// Attach returns ctx carrying w.
func (w *Wakes) Attach(ctx context.Context) context.Context {
	return context.WithValue(ctx, wakesKey{}, w)
}

// Wake records that channel should be notified once tx commits. It reports
// false when ctx carries no wake set for tx's connection: the caller must
// notify inside the transaction itself.
func Wake(ctx context.Context, tx pgx.Tx, channel string) bool {
	w, ok := ctx.Value(wakesKey{}).(*Wakes)
	if !ok || w.conn != tx.Conn() {
		return false
	}
	if !slices.Contains(w.channels, channel) {
		w.channels = append(w.channels, channel)
	}
	return true
}

// Pending reports whether Send has anything to send.
func (w *Wakes) Pending() bool { return len(w.channels) > 0 }

// Execer runs a statement outside the committed transaction (a pool or a
// connection).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Send notifies the recorded channels in one statement and empties the set.
// A notification is a hint that saves a poll: its failure loses nothing.
func (w *Wakes) Send(ctx context.Context, db Execer) error {
	if len(w.channels) == 0 {
		return nil
	}
	channels := w.channels
	w.channels = nil
	if _, err := db.Exec(ctx, `SELECT pg_notify(c, '') FROM unnest($1::text[]) AS c`, channels); err != nil {
		return fmt.Errorf("notify %v after commit: %w", channels, err)
	}
	return nil
}

// Reset forgets the recorded channels (the transaction rolled back).
func (w *Wakes) Reset() { w.channels = nil }
