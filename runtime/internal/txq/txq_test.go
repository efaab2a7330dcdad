package txq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/internal/txq"
)

func setup(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	_, err := pool.Exec(ctx, `CREATE TABLE notes (id int PRIMARY KEY)`)
	require.NoError(t, err)
	return ctx, pool
}

// begin opens a transaction on a fresh schema, rolled back at cleanup.
func begin(t *testing.T) (context.Context, pgx.Tx) {
	t.Helper()
	ctx, pool := setup(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return ctx, tx
}

func count(ctx context.Context, t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var n int
	require.NoError(t, q.QueryRow(ctx, `SELECT count(*) FROM notes`).Scan(&n))
	return n
}

func TestScope(t *testing.T) {
	t.Parallel()

	t.Run("WithoutScopeExecRunsAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		var rows int64
		require.NoError(t, txq.Exec(ctx, tx, func(tag pgconn.CommandTag, err error) error {
			rows = tag.RowsAffected()
			return err
		}, `INSERT INTO notes VALUES (1)`))
		require.EqualValues(t, 1, rows)
		require.Equal(t, 1, count(ctx, t, tx))
		err := txq.Exec(ctx, tx, nil, `INSERT INTO notes VALUES (1)`)
		require.ErrorContains(t, err, "23505", "the statement's own error when result is nil")
	})

	t.Run("QueuedUntilFlushThenEveryResultSeesItsOutcome", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		stx, scope := txq.WithScope(tx)
		var seen []string
		record := func(name string) txq.Result {
			return func(tag pgconn.CommandTag, err error) error {
				if err != nil {
					seen = append(seen, name+": error")
					return errors.New(name + " failed")
				}
				seen = append(seen, name+": "+tag.String())
				return nil
			}
		}
		require.NoError(t, txq.Exec(ctx, stx, record("a"), `INSERT INTO notes VALUES (1)`))
		require.NoError(t, txq.Exec(ctx, stx, record("b"), `INSERT INTO notes VALUES (2)`))
		require.Equal(t, 2, scope.Len())
		require.Empty(t, seen)
		require.Equal(t, 0, count(ctx, t, tx), "nothing is sent before Flush")
		require.NoError(t, scope.Flush(ctx))
		require.Equal(t, []string{"a: INSERT 0 1", "b: INSERT 0 1"}, seen)
		require.Equal(t, 2, count(ctx, t, tx))
		require.Zero(t, scope.Len())

		seen = nil
		require.NoError(t, txq.Exec(ctx, stx, record("dup"), `INSERT INTO notes VALUES (1)`))
		require.NoError(t, txq.Exec(ctx, stx, record("after"), `INSERT INTO notes VALUES (3)`))
		err := scope.Flush(ctx)
		require.EqualError(t, err, "dup failed", "the first failure is reported")
		require.Equal(t, []string{"dup: error", "after: error"}, seen, "statements after a failure still get their result")
	})

	t.Run("OnlyForItsOwnTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		stx, scope := txq.WithScope(tx)
		sp, err := stx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, txq.Exec(ctx, sp, nil, `INSERT INTO notes VALUES (1)`))
		require.Zero(t, scope.Len(), "a savepoint of the scope's transaction writes at once")
		require.NoError(t, sp.Rollback(ctx))

		same, s2, owned := txq.Open(stx)
		require.False(t, owned)
		require.Same(t, scope, s2)
		require.Equal(t, pgx.Tx(stx), same)
		_, s3, owned := txq.Open(tx)
		require.True(t, owned)
		require.NotSame(t, scope, s3)
	})

	t.Run("DiscardSendsNothing", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		stx, scope := txq.WithScope(tx)
		var got error
		require.NoError(t, txq.Exec(ctx, stx, func(_ pgconn.CommandTag, err error) error { got = err; return err },
			`INSERT INTO notes VALUES (1)`))
		cause := errors.New("handler failed")
		scope.Discard(cause)
		require.ErrorIs(t, got, cause)
		require.NoError(t, scope.Flush(ctx))
		require.Equal(t, 0, count(ctx, t, tx))
	})
}

func TestWakes(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	listener, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN wake_test`)
	require.NoError(t, err)
	notified := func() bool {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := listener.Conn().WaitForNotification(wctx)
		return err == nil
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	wakes := txq.NewWakes(tx)
	wtx := txq.New(tx, wakes, nil)
	require.False(t, txq.Wake(tx, "wake_test"), "no wake set on the transaction: notify in it")

	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.False(t, txq.Wake(txq.New(other, wakes, nil), "wake_test"), "another transaction is not covered by the set")
	require.NoError(t, other.Rollback(ctx))

	sp, err := wtx.Begin(ctx)
	require.NoError(t, err)
	require.True(t, txq.Wake(sp, "wake_test"), "a savepoint shares its transaction's set")
	require.True(t, txq.Wake(wtx, "wake_test"))
	require.True(t, wakes.Pending())
	require.NoError(t, tx.Commit(ctx))
	require.False(t, notified(), "nothing was notified inside the transaction")

	require.NoError(t, wakes.Send(ctx, pool))
	require.True(t, notified(), "Send notifies after the commit")
	require.False(t, wakes.Pending())
	require.NoError(t, wakes.Send(ctx, pool), "an empty set sends nothing")
}

func TestQuery(t *testing.T) {
	t.Parallel()
	insert := `INSERT INTO notes SELECT unnest($1::int[]) RETURNING id`
	scanInto := func(got *[]int) func(pgx.Rows) error {
		return func(rows pgx.Rows) error {
			var id int
			_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
				*got = append(*got, id)
				return nil
			})
			return err
		}
	}

	t.Run("WithoutScopeRunsAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		var got []int
		var rows int64
		require.NoError(t, txq.Query(ctx, tx, scanInto(&got), func(tag pgconn.CommandTag, err error) error {
			rows = tag.RowsAffected()
			return err
		}, insert, []int{1, 2}))
		require.ElementsMatch(t, []int{1, 2}, got)
		require.EqualValues(t, 2, rows)
		err := txq.Query(ctx, tx, scanInto(&got), nil, insert, []int{1})
		require.ErrorContains(t, err, "23505")
	})

	t.Run("QueuedRowsAreReadAtFlush", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		stx, scope := txq.WithScope(tx)
		var got []int
		require.NoError(t, txq.Exec(ctx, stx, nil, `INSERT INTO notes VALUES (7)`))
		require.NoError(t, txq.Query(ctx, stx, scanInto(&got), nil, insert, []int{8, 9}))
		require.Empty(t, got, "nothing is sent before the flush")
		require.NoError(t, scope.Flush(ctx))
		require.ElementsMatch(t, []int{8, 9}, got)
		require.Equal(t, 3, count(ctx, t, tx))
	})

	t.Run("QueuedFailureAndScanErrorAreReported", func(t *testing.T) {
		t.Parallel()
		ctx, tx := begin(t)
		stx, scope := txq.WithScope(tx)
		var got []int
		require.NoError(t, txq.Query(ctx, stx, scanInto(&got), nil, insert, []int{1, 1}))
		require.ErrorContains(t, scope.Flush(ctx), "23505")

		ctx, tx = begin(t)
		stx, scope = txq.WithScope(tx)
		errScan := errors.New("cannot read")
		require.NoError(t, txq.Query(ctx, stx, func(pgx.Rows) error { return errScan }, nil, insert, []int{3}))
		require.ErrorIs(t, scope.Flush(ctx), errScan)
	})
}

// beginWithWakes opens a transaction with a wake set, rolled back at
// cleanup if it was not committed.
func beginWithWakes(t *testing.T) (context.Context, *pgxpool.Pool, pgx.Tx, *txq.Wakes) {
	t.Helper()
	ctx, pool := setup(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return ctx, pool, tx, txq.NewWakes(tx)
}

func TestAfterCommit(t *testing.T) {
	t.Parallel()
	ctx, pool, tx, wakes := beginWithWakes(t)
	var ran []string
	work := func(name string) func(context.Context) {
		return func(context.Context) { ran = append(ran, name) }
	}

	require.False(t, txq.AfterCommit(txq.New(tx, wakes, nil), work("no scope")), "needs a scope")
	unbound, _ := txq.WithScope(tx)
	require.False(t, txq.AfterCommit(unbound, work("unbound")), "needs a scope whose work commits with a wake set")
	stx, scope := txq.WithScope(txq.New(tx, wakes, nil))
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.False(t, txq.AfterCommit(other, work("other tx")), "the scope covers its own transaction only")
	require.NoError(t, other.Rollback(ctx))

	require.True(t, txq.AfterCommit(stx, work("discarded")))
	scope.Discard(errors.New("handler failed"))
	require.False(t, wakes.Pending(), "a discarded scope hands nothing on")

	require.True(t, txq.AfterCommit(stx, work("kept")))
	require.False(t, wakes.Pending(), "nothing reaches the wake set before Keep")
	scope.Keep()
	require.True(t, wakes.Pending())
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, ran, "nothing runs before Send")
	require.NoError(t, wakes.Send(ctx, pool))
	require.Equal(t, []string{"kept"}, ran)
	require.False(t, wakes.Pending())

	require.True(t, txq.AfterCommit(stx, work("rolled back")))
	scope.Keep()
	wakes.Reset()
	require.NoError(t, wakes.Send(ctx, pool))
	require.Equal(t, []string{"kept"}, ran, "Reset drops the work of a transaction that did not commit")
}

// counter is a Collector that records what kept work added and how often
// it was flushed.
type counter struct {
	added   []string
	flushes int
}

func (c *counter) Flush(context.Context) { c.flushes++ }

func TestCollectorFor(t *testing.T) {
	t.Parallel()
	ctx, pool, tx, wakes := beginWithWakes(t)
	newCounter := func() txq.Collector { return &counter{} }

	_, ok := txq.CollectorFor(txq.New(tx, wakes, nil), "k", newCounter)
	require.False(t, ok, "needs a scope bound to a wake set, as AfterCommit does")

	// Three handlers' scopes on one transaction: two kept, one discarded.
	var c *counter
	for _, h := range []struct {
		name string
		keep bool
	}{{"first", true}, {"failed", false}, {"second", true}} {
		stx, scope := txq.WithScope(txq.New(tx, wakes, nil))
		got, ok := txq.CollectorFor(stx, "k", newCounter)
		require.True(t, ok)
		if c == nil {
			c = got.(*counter)
		}
		require.Same(t, c, got, "one collector per key and transaction")
		name := h.name
		require.True(t, txq.AfterCommit(stx, func(context.Context) { c.added = append(c.added, name) }))
		if h.keep {
			scope.Keep()
		} else {
			scope.Discard(errors.New("handler failed"))
		}
	}
	require.NoError(t, tx.Commit(ctx))
	require.Zero(t, c.flushes, "nothing runs before Send")
	require.NoError(t, wakes.Send(ctx, pool))
	require.Equal(t, []string{"first", "second"}, c.added, "only kept work contributes")
	require.Equal(t, 1, c.flushes, "flushed once per transaction, after the work")
	require.NoError(t, wakes.Send(ctx, pool))
	require.Equal(t, 1, c.flushes, "a sent set is empty")
}

// notesPart stages note ids and writes them with one statement.
type notesPart struct {
	ids      []int
	outcomes []error
	queued   int
}

func (p *notesPart) add(id int) { p.ids = append(p.ids, id) }

func (p *notesPart) Queue(ctx context.Context, tx pgx.Tx) {
	p.queued++
	// A part's own writes go to the flush's scope, not to the stage.
	_, staged := txq.PartFor(tx, "notes", func() txq.Part { return &notesPart{} })
	if staged {
		panic("a part's own writes were staged again")
	}
	_ = txq.Exec(ctx, tx, func(_ pgconn.CommandTag, err error) error {
		p.outcomes = append(p.outcomes, err)
		return err
	}, `INSERT INTO notes SELECT unnest($1::int[])`, p.ids)
}

func (p *notesPart) Discard(err error) { p.outcomes = append(p.outcomes, err) }

func TestStage(t *testing.T) {
	t.Parallel()

	stageOn := func(t *testing.T) (context.Context, pgx.Tx, *txq.Stage, func() *notesPart) {
		ctx, tx := begin(t)
		wakes := txq.NewWakes(tx)
		st := txq.NewStage(tx, wakes)
		btx := txq.New(tx, wakes, st)
		part := func() *notesPart {
			p, ok := txq.PartFor(btx, "notes", func() txq.Part { return &notesPart{} })
			require.True(t, ok)
			return p.(*notesPart)
		}
		return ctx, btx, st, part
	}

	t.Run("FlushWritesEveryHandlersRowsOnce", func(t *testing.T) {
		t.Parallel()
		ctx, tx, st, part := stageOn(t)
		part().add(1)
		part().add(2)
		p := part()
		require.Same(t, p, part(), "one part per key")
		require.Zero(t, count(ctx, t, tx), "nothing written before the flush")
		require.NoError(t, txq.Sync(ctx, tx))
		require.Zero(t, count(ctx, t, tx), "Sync does not flush a stage")
		require.NoError(t, st.Flush(ctx))
		require.Equal(t, 2, count(ctx, t, tx))
		require.Equal(t, 1, p.queued)
		require.Equal(t, []error{nil}, p.outcomes)
		require.NoError(t, st.Flush(ctx), "an empty stage sends nothing")
		require.Equal(t, 1, p.queued)
	})

	t.Run("AFailedFlushReportsToEveryPart", func(t *testing.T) {
		t.Parallel()
		ctx, tx, st, part := stageOn(t)
		part().add(1)
		part().add(1)
		p := part()
		later, ok := txq.PartFor(tx, "later", func() txq.Part { return &notesPart{} })
		require.True(t, ok)
		later.(*notesPart).add(2)
		err := st.Flush(ctx)
		require.ErrorContains(t, err, "23505")
		require.Len(t, p.outcomes, 1)
		require.ErrorContains(t, p.outcomes[0], "23505")
		require.Len(t, later.(*notesPart).outcomes, 1, "the part after the failed one hears of it too")
		require.ErrorContains(t, later.(*notesPart).outcomes[0], "not applied after an earlier statement failed")
		require.Equal(t, byte('E'), tx.Conn().PgConn().TxStatus(), "the transaction is unusable: the owner rolls back")
	})

	t.Run("DiscardWritesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, tx, st, part := stageOn(t)
		part().add(1)
		p := part()
		failed := errors.New("a handler failed")
		st.Discard(failed)
		require.Equal(t, []error{failed}, p.outcomes)
		require.NoError(t, st.Flush(ctx))
		require.Zero(t, p.queued)
		require.Zero(t, count(ctx, t, tx))
	})

	t.Run("OnlyForItsTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, tx, _, _ := stageOn(t)
		_, plain := begin(t)
		_, ok := txq.PartFor(plain, "notes", func() txq.Part { return &notesPart{} })
		require.False(t, ok, "no stage on a plain transaction")
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, ok = txq.PartFor(sp, "notes", func() txq.Part { return &notesPart{} })
		require.False(t, ok, "a savepoint writes at once, as its owner expects")
	})
}
