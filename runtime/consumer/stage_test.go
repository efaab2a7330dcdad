package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/consumer"
)

// countOutboxInserts makes the test's database count the statements that
// insert into saga_outbox (a statement-level trigger), and returns a
// function that reads the count.
func (b *testBundle) countOutboxInserts() func() int {
	b.t.Helper()
	_, err := b.pool.Exec(b.ctx, `
CREATE TABLE outbox_inserts (n int NOT NULL);
INSERT INTO outbox_inserts VALUES (0);
CREATE FUNCTION count_outbox_insert() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE outbox_inserts SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER count_outbox_insert AFTER INSERT ON saga_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION count_outbox_insert();`)
	require.NoError(b.t, err)
	return func() int {
		var n int
		require.NoError(b.t, b.pool.QueryRow(b.ctx, `SELECT n FROM outbox_inserts`).Scan(&n))
		return n
	}
}

func TestStagedOutboxRows(t *testing.T) {
	t.Parallel()

	t.Run("OneInsertPerBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		inserts := b.countOutboxInserts()
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(c, [2]string{"e1", doEnqueue}, [2]string{"e2", doEnqueue}, [2]string{"e3", doEnqueue},
			[2]string{"e4", doEnqueue})
		for _, id := range []string{"e1", "e2", "e3", "e4"} {
			b.waitSettled(id, "done")
		}
		b.stop(c)
		fast, fellBack := consumer.Paths(c.c)
		require.Zero(t, fellBack)
		require.Equal(t, int64(2), fast, "the gate's batch, then the four")
		require.Equal(t, 1, inserts(), "the four handlers' outbox rows went out as one statement")
		var order []string
		rows, err := b.pool.Query(b.ctx, `SELECT message_id FROM saga_outbox ORDER BY id`)
		require.NoError(t, err)
		defer rows.Close() // a failed require inside the loop must not hold the connection the test's cleanup waits for
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			order = append(order, id)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{"e1-out", "e2-out", "e3-out", "e4-out"}, order, "in the order the handlers ran")
		for _, id := range []string{"e1", "e2", "e3", "e4"} {
			require.Equal(t, [][]string{{"e1", "e2", "e3", "e4"}}, b.locksOf(id), "the batch handler locked %s's batch once", id)
		}
	})

	t.Run("AFailedInsertIsAttributedOnTheSavepointPath", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		inserts := b.countOutboxInserts()
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		// s1 and s2 write the same outbox message id: the batch's one
		// insert fails, and nothing tells which handler wrote the
		// duplicate until each writes in its own savepoint.
		b.sendOneBatch(c, [2]string{"e1", doEnqueue}, [2]string{"s1", doEnqueueShared},
			[2]string{"s2", doEnqueueShared}, [2]string{"e2", doEnqueue})
		for _, id := range []string{"e1", "s1", "e2"} {
			b.waitSettled(id, "done")
		}
		b.waitSettled("s2", "park")
		b.stop(c)

		_, fellBack := consumer.Paths(c.c)
		require.Equal(t, int64(1), fellBack)
		require.Equal(t, 3, inserts(), "the failed batch insert rolled back with its count; then one per savepoint that kept its row")
		require.Equal(t, []int{1, 1}, b.attemptsOf("s2"), "the fast path's failure charged no attempt")
		require.Equal(t, []int{1, 1}, b.attemptsOf("e1"), "e1 ran again on the savepoint path")
		require.Equal(t, [][]string{{"e1", "s1", "s2", "e2"}}, b.locksOf("e1"),
			"the fast path locks its batch ahead; the savepoint path does not: nothing is staged or locked ahead there")
		require.Empty(t, b.effects("s2"))
		for _, id := range []string{"e1", "s1", "e2"} {
			require.Equal(t, []int{1}, b.effects(id), "%s took effect once", id)
		}
		p := b.parked()["s2"]
		require.Contains(t, p.Reason, "shared-out")
		require.Contains(t, p.Reason, "23505")
	})

	t.Run("ASavepointSeesTheRowsStagedBeforeIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(c, [2]string{"e1", doEnqueue}, [2]string{"r1", doSavepointRead}, [2]string{"e2", doEnqueue},
			[2]string{"r2", doSavepointRead})
		for _, id := range []string{"e1", "r1", "e2", "r2"} {
			b.waitSettled(id, "done")
		}
		b.stop(c)
		_, fellBack := consumer.Paths(c.c)
		require.Zero(t, fellBack)
		b.mu.Lock()
		defer b.mu.Unlock()
		require.Equal(t, map[string]int{"r1": 1, "r2": 2}, b.seen,
			"a savepoint is a transaction of its own to the code in it: it sees the rows staged before it")
	})

	t.Run("ASavepointsFailedFlushChargesNoAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(c, [2]string{"s1", doEnqueueShared}, [2]string{"s2", doEnqueueShared},
			[2]string{"r1", doSavepointRead})
		b.waitSettled("s1", "done")
		b.waitSettled("r1", "done")
		b.waitSettled("s2", "park")
		b.stop(c)
		_, fellBack := consumer.Paths(c.c)
		require.Equal(t, int64(1), fellBack)
		require.Equal(t, []int{1, 1}, b.attemptsOf("r1"), "r1's savepoint found the batch's rows failing: not r1's attempt")
		require.Equal(t, []int{1, 1}, b.attemptsOf("s2"))
		b.mu.Lock()
		defer b.mu.Unlock()
		require.Equal(t, map[string]int{"r1": 1}, b.seen, "on the savepoint path, s1's row only")
	})

	t.Run("ABatchFaultChargesNoAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(c, [2]string{"e1", doEnqueue}, [2]string{"f1", doBatchFault}, [2]string{"e2", doEnqueue})
		for _, id := range []string{"e1", "f1", "e2"} {
			b.waitSettled(id, "done")
		}
		b.stop(c)
		_, fellBack := consumer.Paths(c.c)
		require.Equal(t, int64(1), fellBack)
		require.Equal(t, [][]string{{"e1", "f1", "e2"}}, b.locksOf("f1"), "the batch failed as a whole on the fast path only")
		for _, id := range []string{"e1", "f1", "e2"} {
			require.Equal(t, []int{1}, b.attemptsOf(id),
				"no handler ran before the batch failed as a whole; the batch's failure charged %s no attempt", id)
		}
		for _, id := range []string{"e1", "f1", "e2"} {
			require.Equal(t, []int{1}, b.effects(id), "%s took effect once", id)
		}
	})
}
