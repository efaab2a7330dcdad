// Package txq saves database round trips on the runtime's hot path. Its
// one type, [Tx], is a transaction together with what its owner sends
// later; the code that writes finds that on the transaction it was given,
// never in a context:
//
//   - A [Scope] queues writes whose results nobody reads before the handler
//     returns (the saga row update, its audit row, outbox rows, a
//     participant's stored reply) and sends them as one pipeline on
//     [Scope.Flush]. Given a transaction without a scope, [Exec] runs the
//     statement at once, as usual.
//   - [Wakes] collects the notifications a transaction would send (the
//     outbox's relay wake-up) so that its owner sends them after COMMIT
//     instead of inside the transaction. A NOTIFY inside a transaction
//     takes a cluster-wide lock that is held through the commit's WAL
//     flush, so concurrent committers queue behind each other instead of
//     sharing one flush. A wake set also runs the after-commit work of the
//     scopes that were kept into it ([AfterCommit], [Scope.Keep]): the
//     outbox hands rows its process just committed to a local relay.
//   - A [Stage] carries rows that many handlers of one transaction write
//     to the same table (saga instance updates, outbox and audit rows) to
//     the end of the batch, where each kind goes out as one multi-row
//     statement.
//
// Every path that opens a transaction makes a [Tx] for it ([BeginFunc],
// the consumer's batches, the timeout scanner) and hands it to the code
// that writes. A savepoint begun on a [Tx] shares its wake set but has no
// scope or stage of its own: what runs in it writes immediately.
package txq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Result receives the outcome of one statement (its error nil on success)
// and returns the error to report for it, or nil.
type Result func(tag pgconn.CommandTag, err error) error

// Tx is a transaction as the runtime's writing code receives it: the
// transaction itself, plus (each may be nil) the scope its writes are
// queued in, the stage its batch-wide rows go to, and the wake set that
// runs its after-commit work. It is a pgx.Tx; code that gets a plain
// pgx.Tx writes at once.
type Tx struct {
	pgx.Tx
	scope *Scope
	stage *Stage
	wakes *Wakes
}

// of returns tx as a *Tx, or nil when it is a plain transaction.
func of(tx pgx.Tx) *Tx {
	t, _ := tx.(*Tx)
	return t
}

// unwrap returns the transaction under tx.
func unwrap(tx pgx.Tx) pgx.Tx {
	if t := of(tx); t != nil {
		return t.Tx
	}
	return tx
}

// New returns tx carrying w (may be nil) and st (may be nil), without a
// scope: the consumer's batch transaction before a handler runs in it.
func New(tx pgx.Tx, w *Wakes, st *Stage) *Tx {
	return &Tx{Tx: unwrap(tx), stage: st, wakes: w}
}

// Begin begins a savepoint that shares t's wake set; it has no scope or
// stage, so what runs in it writes at once.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{Tx: sp, wakes: t.wakes}, nil
}

// Scope queues the writes of one handler invocation on one transaction.
type Scope struct {
	tx      pgx.Tx
	batch   pgx.Batch
	results []Result
	rows    []func(pgx.Rows) error // per queued statement; nil for Exec

	wakes *Wakes                  // the wake set its work commits with
	after []func(context.Context) // AfterCommit work, until Keep or Discard
}

// WithScope returns tx with a new scope: [Exec] calls on the returned
// transaction are queued in it. The caller owns the scope: it must call
// Flush before anything reads what the queued statements write, and before
// committing. The returned transaction keeps tx's stage and wake set; the
// scope's after-commit work commits with that wake set.
func WithScope(tx pgx.Tx) (*Tx, *Scope) {
	t := &Tx{Tx: unwrap(tx)}
	if o := of(tx); o != nil {
		t.stage, t.wakes = o.stage, o.wakes
	}
	t.scope = &Scope{tx: t.Tx, wakes: t.wakes}
	return t, t.scope
}

// Open returns tx when it has a scope, or tx with a new scope owned by the
// caller (owned = true: the caller flushes it). An owned scope's work does
// not commit with tx's wake set, whose owner cannot tell whether the
// caller's writes commit: [AfterCommit] on it reports false.
func Open(tx pgx.Tx) (_ pgx.Tx, s *Scope, owned bool) {
	if t := of(tx); t != nil && t.scope != nil {
		return t, t.scope, false
	}
	t, s := WithScope(tx)
	s.wakes = nil
	return t, s, true
}

// Exec runs sql on tx, or queues it when tx has a scope. result (nil:
// report the statement's own error) sees the outcome either way: now, or
// when the scope is flushed; a queued statement's error is returned by
// Flush.
func Exec(ctx context.Context, tx pgx.Tx, result Result, sql string, args ...any) error {
	if result == nil {
		result = passError
	}
	if t := of(tx); t != nil && t.scope != nil {
		s := t.scope
		s.batch.Queue(sql, args...)
		s.results = append(s.results, result)
		s.rows = append(s.rows, nil)
		return nil
	}
	tag, err := tx.Exec(ctx, sql, args...)
	return result(tag, err)
}

// Query is [Exec] for a statement that returns rows: scan reads them (it
// may close them), now or when the scope is flushed, and result sees the
// statement's outcome afterwards. An error from scan is the statement's
// error.
func Query(ctx context.Context, tx pgx.Tx, scan func(pgx.Rows) error, result Result, sql string, args ...any) error {
	if result == nil {
		result = passError
	}
	if t := of(tx); t != nil && t.scope != nil {
		s := t.scope
		s.batch.Queue(sql, args...)
		s.results = append(s.results, result)
		s.rows = append(s.rows, scan)
		return nil
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return result(pgconn.CommandTag{}, err)
	}
	return result(readRows(rows, scan))
}

// readRows runs scan over rows and closes them, returning the statement's
// command tag and the first error.
func readRows(rows pgx.Rows, scan func(pgx.Rows) error) (pgconn.CommandTag, error) {
	err := scan(rows)
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return rows.CommandTag(), err
}

// AfterCommit arranges for fn to run once the transaction tx belongs to has
// committed, and reports whether it could: only when tx has a scope whose
// work commits with a wake set. fn then runs after that wake set's commit
// if the scope is kept ([Scope.Keep]), and never if it is discarded or the
// transaction rolls back. Callers that get false must do without (for the
// outbox: let relays claim the rows).
func AfterCommit(tx pgx.Tx, fn func(context.Context)) bool {
	t := of(tx)
	if t == nil || t.scope == nil || t.scope.wakes == nil {
		return false
	}
	t.scope.after = append(t.scope.after, fn)
	return true
}

// Collector gathers what the kept after-commit work of one transaction
// contributes (see [CollectorFor]) and acts on it once, after the commit.
type Collector interface {
	// Flush runs once after the commit, after all of the transaction's
	// kept work; it sees only what kept work contributed.
	Flush(ctx context.Context)
}

// CollectorFor returns the collector registered under key for the
// transaction tx's scope commits with, made by newCollector on first use.
// It reports false where [AfterCommit] would. Work registered with
// AfterCommit adds to the collector (when its scope is kept), and the
// collector's Flush runs once after the commit: one action per transaction
// rather than one per piece of work.
func CollectorFor(tx pgx.Tx, key any, newCollector func() Collector) (Collector, bool) {
	t := of(tx)
	if t == nil || t.scope == nil || t.scope.wakes == nil {
		return nil, false
	}
	return lookup(&t.scope.wakes.collectors, key, newCollector), true
}

// keyed is a value registered under a key.
type keyed[T any] struct {
	key any
	v   T
}

// find returns the value under key in list.
func find[T any](list []keyed[T], key any) (T, bool) {
	for _, kv := range list {
		if kv.key == key {
			return kv.v, true
		}
	}
	var zero T
	return zero, false
}

// lookup returns the value under key in *list, adding one made by newValue
// when there is none.
func lookup[T any](list *[]keyed[T], key any, newValue func() T) T {
	if v, ok := find(*list, key); ok {
		return v
	}
	v := newValue()
	*list = append(*list, keyed[T]{key, v})
	return v
}

// Keep hands the scope's after-commit work to its wake set, to run after
// the commit. The owner calls it once the handler has succeeded and its
// writes were flushed; work registered later needs another Keep.
func (s *Scope) Keep() {
	if s.wakes != nil {
		s.wakes.after = append(s.wakes.after, s.after...)
	}
	s.after = nil
}

// Run runs fn on tx (a transaction or a savepoint of it, carrying its wake
// set and stage) as a consumer runs a handler: fn gets tx with a scope of
// its own whose queued writes are sent when fn succeeds and whose
// after-commit work is then kept for tx's wake set; when fn or the send
// fails, or fn returned success with the transaction aborted (it ignored a
// statement's error), the scope is discarded and its work never runs.
func Run(ctx context.Context, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) error {
	stx, s := WithScope(tx)
	err := fn(ctx, stx)
	if err == nil {
		err = s.Flush(ctx)
	}
	if err == nil && tx.Conn().PgConn().TxStatus() == 'E' {
		err = ErrAborted
	}
	if err != nil {
		s.Discard(err)
		return err
	}
	s.Keep()
	return nil
}

// ErrAborted is Run's error when fn returned success but a statement in
// its transaction failed: the transaction is aborted, so nothing fn wrote
// can commit.
var ErrAborted = errors.New("returned success, but a statement in its transaction failed (was an error ignored?)")

// Beginner starts transactions (a pool).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// BeginFunc runs fn with [Run] in a new transaction of db that carries a
// wake set handing off to relay (see [Wakes.HandOffTo]; nil: none), and
// commits. It returns the wake set to [Wakes.Send] once it returned without
// error (the commit succeeded); on an error nothing of fn's after-commit
// work may run.
func BeginFunc(ctx context.Context, db Beginner, relay any, fn func(ctx context.Context, tx pgx.Tx) error) (*Wakes, error) {
	var w *Wakes
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		w = NewWakes(tx)
		w.HandOffTo(relay)
		return Run(ctx, New(tx, w, nil), fn)
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Pool begins transactions and runs statements outside them.
type Pool interface {
	Beginner
	Execer
}

// Do is [BeginFunc] followed, once the commit succeeded, by [Wakes.Notify]:
// the way a runtime path that owns its transaction (Engine.InTx, an admin
// repair) runs one. relay (nil: none) is the local relay the transaction's
// committed outbox rows are handed to ([Wakes.HandOffTo]).
func Do(ctx context.Context, db Pool, log *slog.Logger, relay any, fn func(ctx context.Context, tx pgx.Tx) error) error {
	w, err := BeginFunc(ctx, db, relay, fn)
	if err != nil {
		return err
	}
	w.Notify(ctx, db, log)
	return nil
}

// Sync sends what tx's scope has queued (nothing when there is no scope or
// it is empty), so that a following read sees it. The runtime calls it
// before reading a table it may have queued writes for.
func Sync(ctx context.Context, tx pgx.Tx) error {
	if t := of(tx); t != nil && t.scope != nil {
		return t.scope.Flush(ctx)
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
	s.results, s.rows, s.batch = nil, nil, pgx.Batch{}
	s.after = nil
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
	results, scans := s.results, s.rows
	batch := s.batch
	s.results, s.rows, s.batch = nil, nil, pgx.Batch{}
	br := s.tx.SendBatch(ctx, &batch)
	var first error
	for i, r := range results {
		var (
			tag pgconn.CommandTag
			err error
		)
		if scans[i] == nil {
			tag, err = br.Exec()
		} else {
			rows, qerr := br.Query()
			if qerr != nil {
				err = qerr
				rows.Close()
			} else {
				tag, err = readRows(rows, scans[i])
			}
		}
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

// Wakes collects notification channels to signal, and kept scopes'
// after-commit work to run, after a transaction commits.
type Wakes struct {
	conn       *pgx.Conn
	relay      any // where committed outbox rows are handed (HandOffTo)
	channels   []string
	after      []func(context.Context)
	collectors []keyed[Collector]
}

// HandOffTo names the relay of this process (an *outbox.Relay) that the
// outbox hands the rows this transaction commits to, instead of waking
// relays to claim them; nil names none. The owner of the transaction (a
// consumer, an engine, the timeout scanner) says so when it makes the wake
// set, before anything writes.
func (w *Wakes) HandOffTo(relay any) { w.relay = relay }

// HandOff returns the relay tx's committed outbox rows are handed to (see
// [Wakes.HandOffTo]), or nil when tx carries no wake set or names none.
func HandOff(tx pgx.Tx) any {
	if t := of(tx); t != nil && t.wakes != nil {
		return t.wakes.relay
	}
	return nil
}

// NewWakes returns an empty wake set for tx. On a [Tx] that carries it (or
// a savepoint begun on one), [Wake] records the channel in the set instead
// of notifying inside the transaction. After a successful commit the owner
// calls Send.
func NewWakes(tx pgx.Tx) *Wakes {
	return &Wakes{conn: tx.Conn()}
}

// Wake records that channel should be notified once tx commits. It reports
// false when tx carries no wake set: the caller must notify inside the
// transaction itself.
func Wake(tx pgx.Tx, channel string) bool {
	t := of(tx)
	if t == nil || t.wakes == nil || t.wakes.conn != tx.Conn() {
		return false
	}
	w := t.wakes
	if !slices.Contains(w.channels, channel) {
		w.channels = append(w.channels, channel)
	}
	return true
}

// Pending reports whether Send has anything to send or run.
func (w *Wakes) Pending() bool { return len(w.channels) > 0 || len(w.after) > 0 }

// Execer runs a statement outside the committed transaction (a pool or a
// connection).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Send runs the kept after-commit work, flushes the collectors, notifies
// the recorded channels in one statement, and empties the set. Call it only
// after the commit succeeded. A notification is a hint that saves a poll:
// its failure loses nothing.
func (w *Wakes) Send(ctx context.Context, db Execer) error {
	after, collectors := w.after, w.collectors
	w.after, w.collectors = nil, nil
	for _, fn := range after {
		fn(ctx)
	}
	for _, c := range collectors {
		c.v.Flush(ctx)
	}
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

// Notify is [Wakes.Send] for an owner that has nothing better to do with
// a failure than log it: a lost notification costs only latency, as relays
// poll.
func (w *Wakes) Notify(ctx context.Context, db Execer, log *slog.Logger) {
	if err := w.Send(ctx, db); err != nil {
		log.WarnContext(ctx, "wake-up after commit failed; relays will find the messages by polling", slog.Any("error", err))
	}
}

// Reset forgets the recorded channels and work (the transaction rolled
// back).
func (w *Wakes) Reset() { w.channels, w.after, w.collectors = nil, nil, nil }

// Results returns a Result that passes the outcome to each of rs and
// reports the first error they return: one statement written for many
// callers.
func Results(rs []Result) Result {
	return func(tag pgconn.CommandTag, err error) error {
		var first error
		for _, r := range rs {
			if e := r(tag, err); e != nil && first == nil {
				first = e
			}
		}
		return first
	}
}
