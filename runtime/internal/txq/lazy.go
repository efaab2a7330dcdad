package txq

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lazy is a transaction on a pooled connection that sends BEGIN in the same
// round trip as its first statement, and, when its owner says the next batch
// is its last ([Lazy.CommitWithNextBatch]), COMMIT in the same round trip as
// that batch: two round trips fewer per transaction than pgx's, which sends
// each on its own.
//
// A statement that fails aborts the transaction as usual (the server skips
// the rest of a pipeline, the COMMIT included, until its end); Rollback then
// ends it. Commit reports whether the COMMIT sent with the last batch
// succeeded, or sends COMMIT when none was.
type Lazy struct {
	conn   *pgxpool.Conn
	begun  bool // BEGIN sent
	closed bool
	// commitNext: the next batch carries COMMIT. committed: it did and the
	// server answered COMMIT; commitErr: it did and COMMIT failed.
	commitNext, committed, commitSent bool
	commitErr                         error
	savepoints                        int
}

// BeginLazy acquires a connection of pool for a [Lazy] transaction; nothing
// is sent until its first statement.
func BeginLazy(ctx context.Context, pool *pgxpool.Pool) (*Lazy, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &Lazy{conn: c}, nil
}

// CommitWithNextBatch makes the next SendBatch on t end with COMMIT. The
// owner calls it when nothing follows that batch but the commit.
func (t *Lazy) CommitWithNextBatch() { t.commitNext = true }

// LazyOf returns the Lazy transaction under tx, or nil.
func LazyOf(tx pgx.Tx) *Lazy {
	for {
		switch v := tx.(type) {
		case *Lazy:
			return v
		case *Tx:
			tx = v.Tx
		case interface{ Unwrap() pgx.Tx }:
			tx = v.Unwrap()
		default:
			return nil
		}
	}
}

// Conn returns the transaction's connection.
func (t *Lazy) Conn() *pgx.Conn { return t.conn.Conn() }

// begin sends BEGIN alone, when no statement carried it yet.
func (t *Lazy) begin(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if t.begun {
		return nil
	}
	t.begun = true
	_, err := t.conn.Exec(ctx, "BEGIN")
	return err
}

// send sends b on the connection, preceded by BEGIN when the transaction
// has not begun and followed by COMMIT when the owner asked for it, and
// returns its results with BEGIN's already read.
func (t *Lazy) send(ctx context.Context, b *pgx.Batch, commit bool) pgx.BatchResults {
	if t.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	withBegin := !t.begun
	qs := b.QueuedQueries
	if withBegin || commit {
		qs = make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+2)
		if withBegin {
			qs = append(qs, &pgx.QueuedQuery{SQL: "BEGIN"})
		}
		qs = append(qs, b.QueuedQueries...)
		if commit {
			c := &pgx.QueuedQuery{SQL: "COMMIT"}
			c.Exec(func(tag pgconn.CommandTag) error {
				if tag.String() == "ROLLBACK" {
					t.commitErr = pgx.ErrTxCommitRollback
					return t.commitErr
				}
				t.committed = true
				return nil
			})
			qs = append(qs, c)
			t.commitSent = true
		}
	}
	t.begun = true
	br := t.conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs})
	if withBegin {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return pgx.FailedBatchResults(b, fmt.Errorf("begin: %w", err))
		}
	}
	return br
}

// SendBatch sends b in the transaction (see [Lazy]).
func (t *Lazy) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	commit := t.commitNext
	t.commitNext = false
	return t.send(ctx, b, commit)
}

// Exec runs sql in the transaction.
func (t *Lazy) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.begun || t.closed {
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.conn.Exec(ctx, sql, args...)
	}
	var b pgx.Batch
	b.Queue(sql, args...)
	br := t.send(ctx, &b, false)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql in the transaction.
func (t *Lazy) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.begun || t.closed {
		if err := t.begin(ctx); err != nil {
			return nil, err
		}
		return t.conn.Query(ctx, sql, args...)
	}
	var b pgx.Batch
	b.Queue(sql, args...)
	br := t.send(ctx, &b, false)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql in the transaction.
func (t *Lazy) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &lazyRow{rows: rows, err: err}
}

// CopyFrom copies rows into the table in the transaction.
func (t *Lazy) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// LargeObjects is not supported on a Lazy transaction: the runtime uses
// none. Its methods fail.
func (t *Lazy) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare prepares sql on the transaction's connection.
func (t *Lazy) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// Begin begins a savepoint.
func (t *Lazy) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	t.savepoints++
	sp := &savepoint{parent: t, name: fmt.Sprintf("sp_%d", t.savepoints)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// Commit commits the transaction: it reports the outcome of the COMMIT sent
// with the last batch, or sends one.
func (t *Lazy) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	defer t.release()
	switch {
	case t.committed:
		return nil
	case t.commitErr != nil:
		return t.commitErr
	case t.commitSent:
		// The batch failed before its COMMIT: the transaction is aborted.
		_, _ = t.conn.Exec(ctx, "ROLLBACK")
		return pgx.ErrTxCommitRollback
	case !t.begun:
		return nil
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return err
}

// Rollback rolls the transaction back (nothing to do when it never began or
// already committed).
func (t *Lazy) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	defer t.release()
	if !t.begun || t.committed || t.conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.conn.Conn().PgConn().Close(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

func (t *Lazy) release() {
	t.closed = true
	t.conn.Release()
}

// savepoint is a savepoint of a Lazy transaction.
type savepoint struct {
	parent *Lazy
	name   string
	closed bool
}

func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) { return s.parent.Begin(ctx) }
func (s *savepoint) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.conn.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}
func (s *savepoint) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}
func (s *savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return s.parent.CopyFrom(ctx, table, columns, src)
}
func (s *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return s.parent.conn.SendBatch(ctx, b)
}
func (s *savepoint) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (s *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return s.parent.Prepare(ctx, name, sql)
}
func (s *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.parent.conn.Exec(ctx, sql, args...)
}
func (s *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.parent.conn.Query(ctx, sql, args...)
}
func (s *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.parent.conn.QueryRow(ctx, sql, args...)
}
func (s *savepoint) Conn() *pgx.Conn { return s.parent.Conn() }

// batchRows are the rows of a statement sent in a batch with BEGIN: closing
// them closes the batch.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	if r.br == nil {
		return
	}
	r.Rows.Close()
	r.err = r.br.Close()
	r.br = nil
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// lazyRow is QueryRow's row.
type lazyRow struct {
	rows pgx.Rows
	err  error
}

func (r *lazyRow) Scan(dest ...any) error {
	if r.err != nil {
		if r.rows != nil {
			r.rows.Close()
		}
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
