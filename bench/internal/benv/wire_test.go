package benv

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// backendMessage is one backend protocol message: type, length, body.
func backendMessage(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// TestParserSplitReads feeds a stream of backend messages in every chunk
// size from one byte up: the counts must not depend on where reads split
// messages.
func TestParserSplitReads(t *testing.T) {
	var stream []byte
	for _, m := range [][]byte{
		backendMessage('R', "\x00\x00\x00\x00"),
		backendMessage('Z', "I"),
		backendMessage('C', "BEGIN\x00"),
		backendMessage('D', "\x00\x01\x00\x00\x00\x03abc"),
		backendMessage('C', "SELECT 1\x00"),
		backendMessage('C', "INSERT 0 12\x00"),
		backendMessage('C', "UPDATE 3\x00"),
		backendMessage('C', "DELETE 0\x00"),
		backendMessage('C', "SELECT 0\x00"),
		backendMessage('E', "SERROR\x00C23505\x00\x00"),
		backendMessage('C', "COMMIT\x00"),
		backendMessage('C', "ROLLBACK\x00"),
		backendMessage('C', "CREATE TABLE\x00"),
		backendMessage('1', ""), // ParseComplete: empty body
		backendMessage('Z', "T"),
	} {
		stream = append(stream, m...)
	}
	want := []int64{1, 1, 1, 2, 1, 1, 1, 1} // Commands order
	for chunk := 1; chunk <= len(stream); chunk++ {
		var w wireCounts
		var p backendParser
		for i := 0; i < len(stream); i += chunk {
			p.feed(stream[i:min(i+chunk, len(stream))], &w)
		}
		got := make([]int64, len(Commands))
		for i := range got {
			got[i] = w.byCommand[i].Load()
		}
		require.Equal(t, want, got, "chunk %d: counts by %v", chunk, Commands)
		require.EqualValues(t, 9, w.total(), "chunk %d", chunk)
		require.EqualValues(t, 1, w.errors.Load(), "chunk %d", chunk)
	}
}

// TestStatementCounterCountsBatchesAndPipelines checks against a real
// PostgreSQL that a pgx batch of N statements, a pgconn pipeline of N
// statements and a simple query of N statements each count as N, and that
// a transaction's BEGIN and COMMIT count too.
func TestStatementCounterCountsBatchesAndPipelines(t *testing.T) {
	for _, v := range []string{EnvPostgresURL, EnvAMQPURL, EnvRabbitAPI} {
		if os.Getenv(v) == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set: run under scripts/with-services.sh", v)
			}
			t.Skipf("%s is not set: source /tmp/saga-services/env.sh (or run under scripts/with-services.sh)", v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env, err := FromEnv(ctx)
	require.NoError(t, err)
	defer env.Close()
	sc, err := env.NewSchema(ctx, "wire")
	require.NoError(t, err)
	defer sc.Drop()
	var counter StatementCounter
	pool, err := sc.Pool(ctx, 2, &counter)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY)`)
	require.NoError(t, err)

	const n = 7
	count := func(cmd string) int64 {
		for i, c := range Commands {
			if c == cmd {
				return counter.ByCommand()[i]
			}
		}
		t.Fatalf("no command %s", cmd)
		return 0
	}

	t.Run("batch", func(t *testing.T) {
		counter.Reset()
		var b pgx.Batch
		for i := range n {
			b.Queue(`SELECT $1::int`, i)
		}
		require.NoError(t, pool.SendBatch(ctx, &b).Close())
		require.EqualValues(t, n, counter.Total())
		require.EqualValues(t, n, count("SELECT"))
	})

	t.Run("batch in a transaction", func(t *testing.T) {
		counter.Reset()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var b pgx.Batch
			for i := range n {
				b.Queue(`INSERT INTO t (id) VALUES ($1)`, i)
			}
			return tx.SendBatch(ctx, &b).Close()
		})
		require.NoError(t, err)
		require.EqualValues(t, n+2, counter.Total())
		require.EqualValues(t, []int64{1, 1, 0, 0, n, 0, 0, 0}, counter.ByCommand())
	})

	t.Run("pipeline", func(t *testing.T) {
		counter.Reset()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		pl := conn.Conn().PgConn().StartPipeline(ctx)
		for i := range n {
			pl.SendQueryParams(`UPDATE t SET id = id WHERE id = $1`, [][]byte{{byte('0' + i)}}, nil, nil, nil)
		}
		require.NoError(t, pl.Sync())
		require.Equal(t, n, closePipeline(t, pl))
		require.EqualValues(t, n, counter.Total())
		require.EqualValues(t, n, count("UPDATE"))
	})

	t.Run("simple query of several statements", func(t *testing.T) {
		counter.Reset()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Conn().PgConn().Exec(ctx, `SELECT 1; DELETE FROM t WHERE id < 0; SELECT 2`).ReadAll()
		require.NoError(t, err)
		require.EqualValues(t, 3, counter.Total())
		require.EqualValues(t, 2, count("SELECT"))
		require.EqualValues(t, 1, count("DELETE"))
	})

	t.Run("a failing batch counts what ran", func(t *testing.T) {
		counter.Reset()
		var b pgx.Batch
		b.Queue(`SELECT 1`)
		b.Queue(`INSERT INTO t (id) VALUES (0)`) // duplicate key
		b.Queue(`SELECT 2`)                      // skipped by the server after the error
		require.Error(t, pool.SendBatch(ctx, &b).Close())
		require.EqualValues(t, 1, counter.Total())
		require.EqualValues(t, 1, counter.Failed())
	})

	t.Run("round trips", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		tx := func() error {
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				var b pgx.Batch
				for i := range n {
					b.Queue(`SELECT $1::int`, i)
				}
				return tx.SendBatch(ctx, &b).Close()
			})
		}
		require.NoError(t, tx()) // prepares the statement
		counter.Reset()
		for range n {
			_, err := conn.Exec(ctx, `SELECT 1`)
			require.NoError(t, err)
		}
		require.EqualValues(t, n, counter.RoundTrips(), "one statement at a time")
		counter.Reset()
		require.NoError(t, tx())
		require.EqualValues(t, 3, counter.RoundTrips(), "BEGIN, a batch of prepared statements, COMMIT")
		require.EqualValues(t, n+2, counter.Total())
		counter.Reset()
		_, err = conn.Conn().PgConn().Exec(ctx, `SELECT 1; SELECT 2; SELECT 3`).ReadAll()
		require.NoError(t, err)
		require.EqualValues(t, 1, counter.RoundTrips(), "a simple query of several statements")
		counter.Reset()
		pl := conn.Conn().PgConn().StartPipeline(ctx)
		pl.SendQueryParams(`SELECT 1`, nil, nil, nil, nil)
		require.NoError(t, pl.Flush()) // written, answer not read
		pl.SendQueryParams(`SELECT 2`, nil, nil, nil, nil)
		require.NoError(t, pl.Sync())
		require.Equal(t, 2, closePipeline(t, pl))
		require.EqualValues(t, 1, counter.RoundTrips(), "two writes of a pipeline before any answer is read")
	})
}

// closePipeline reads every result of a synced pipeline, closes it and
// returns how many statement results it read.
func closePipeline(t *testing.T, pl *pgconn.Pipeline) int {
	t.Helper()
	results := 0
	for {
		res, err := pl.GetResults()
		require.NoError(t, err)
		if res == nil {
			break
		}
		if rr, ok := res.(*pgconn.ResultReader); ok {
			_, err = rr.Close()
			require.NoError(t, err)
			results++
		}
	}
	require.NoError(t, pl.Close())
	return results
}
