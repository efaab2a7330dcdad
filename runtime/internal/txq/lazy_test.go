package txq_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/internal/txq"
)

func TestLazy(t *testing.T) {
	t.Parallel()

	t.Run("BeginsWithTheFirstStatementAndCommitsWithTheLastBatch", func(t *testing.T) {
		t.Parallel()
		ctx, pool := setup(t)
		tx, err := txq.BeginLazy(ctx, pool)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		require.EqualValues(t, 'I', tx.Conn().PgConn().TxStatus(), "nothing sent before the first statement")
		var one int
		require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one))
		require.EqualValues(t, 'T', tx.Conn().PgConn().TxStatus(), "BEGIN went with the first statement")
		_, err = tx.Exec(ctx, `INSERT INTO notes VALUES (1)`)
		require.NoError(t, err)
		require.Zero(t, count(ctx, t, pool), "not visible before the commit")
		tx.CommitWithNextBatch()
		var b pgx.Batch
		b.Queue(`INSERT INTO notes VALUES (2)`)
		require.NoError(t, tx.SendBatch(ctx, &b).Close())
		require.EqualValues(t, 'I', tx.Conn().PgConn().TxStatus(), "COMMIT went with the batch")
		require.Equal(t, 2, count(ctx, t, pool))
		require.NoError(t, tx.Commit(ctx))
	})

	t.Run("AFailedLastBatchCommitsNothing", func(t *testing.T) {
		t.Parallel()
		ctx, pool := setup(t)
		tx, err := txq.BeginLazy(ctx, pool)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		tx.CommitWithNextBatch()
		var b pgx.Batch
		b.Queue(`INSERT INTO notes VALUES (1)`)
		b.Queue(`INSERT INTO notes VALUES (1)`) // duplicate key: the COMMIT after it never runs
		require.ErrorContains(t, tx.SendBatch(ctx, &b).Close(), "23505")
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback)
		require.Zero(t, count(ctx, t, pool))
	})

	t.Run("ARejectedCommitIsTheBatchsError", func(t *testing.T) {
		t.Parallel()
		ctx, pool := setup(t)
		_, err := pool.Exec(ctx, `CREATE TABLE once (k int UNIQUE DEFERRABLE INITIALLY DEFERRED); INSERT INTO once VALUES (1)`)
		require.NoError(t, err)
		tx, err := txq.BeginLazy(ctx, pool)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO notes VALUES (1)`)
		require.NoError(t, err)
		tx.CommitWithNextBatch()
		var b pgx.Batch
		b.Queue(`INSERT INTO once VALUES (1)`) // fails at COMMIT
		require.ErrorContains(t, tx.SendBatch(ctx, &b).Close(), "23505")
		require.Error(t, tx.Commit(ctx))
		require.Zero(t, count(ctx, t, pool))
	})

	t.Run("SavepointsRollBackTheirOwnWork", func(t *testing.T) {
		t.Parallel()
		ctx, pool := setup(t)
		tx, err := txq.BeginLazy(ctx, pool)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, `INSERT INTO notes VALUES (1)`)
		require.NoError(t, err)
		require.NoError(t, sp.Rollback(ctx))
		_, err = tx.Exec(ctx, `INSERT INTO notes VALUES (2)`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, count(ctx, t, pool))
	})
}
