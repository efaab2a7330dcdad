package saga_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
)

// stagedBatch is a transaction run as a consumer's fast path runs one: a
// stage for the batch, a write scope per handler.
type stagedBatch struct {
	t     *testing.T
	b     *testBundle
	ctx   context.Context
	tx    pgx.Tx
	wakes *txq.Wakes
	stage *txq.Stage
	btx   *txq.Tx              // tx carrying the wake set and stage, as the consumer hands it on
	batch []*consumer.Delivery // what the consumer hands to HandleBatch
}

func (b *testBundle) stagedBatch(t *testing.T) *stagedBatch {
	t.Helper()
	return b.stagedBatchOn(t, b.pool)
}

// stagedBatchOn is stagedBatch with its transaction on pool.
func (b *testBundle) stagedBatchOn(t *testing.T, pool *pgxpool.Pool) *stagedBatch {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	wakes := txq.NewWakes(tx)
	stage := txq.NewStage(tx, wakes)
	return &stagedBatch{t: t, b: b, ctx: ctx, tx: tx, wakes: wakes, stage: stage, btx: txq.New(tx, wakes, stage)}
}

// reply handles a reply of type in to the saga's command waiting for one,
// pending (read by the caller), as a handler of the batch.
func (s *stagedBatch) reply(sagaID, businessKey, pending string, in *message.Info) error {
	s.t.Helper()
	m := msg(in, businessKey)
	env, err := message.New(m, message.Meta{SagaID: sagaID, SagaType: s.b.def.Name, CausationID: pending})
	require.NoError(s.t, err)
	d := &consumer.Delivery{Envelope: env, Message: m, Queue: "test.replies", Attempt: 1}
	stx, scope := txq.WithScope(s.btx)
	if err := s.b.engine.Handle(s.ctx, stx, d); err != nil {
		scope.Discard(err)
		return err
	}
	if err := scope.Flush(s.ctx); err != nil {
		return err
	}
	scope.Keep()
	return nil
}

// countStatements makes the database count the statements of kind
// (INSERT, UPDATE) on table, and returns a function that reads the count.
func (b *testBundle) countStatements(t *testing.T, kind, table string) func() int {
	t.Helper()
	ctx := context.Background()
	name := "count_" + kind + "_" + table
	_, err := b.pool.Exec(ctx, `CREATE TABLE `+name+` (n int NOT NULL);
INSERT INTO `+name+` VALUES (0);
CREATE FUNCTION `+name+`() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE `+name+` SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER `+name+` AFTER `+kind+` ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION `+name+`();`)
	require.NoError(t, err)
	return func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT n FROM `+name).Scan(&n))
		return n
	}
}

// TestStagedWrites: in a consumer's fast path (a txq.Stage for the batch
// transaction) the instance updates, audit rows and outbox rows of all the
// batch's transitions are written by one statement each when the stage is
// flushed, in the order of the transitions, and not before; reads inside
// the transaction see the staged instance.
func TestStagedWrites(t *testing.T) {
	t.Parallel()

	t.Run("OneStatementPerKindAndReadsSeeStagedRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defOptions{})
		audits := b.countStatements(t, "INSERT", "saga_audit")
		updates := b.countStatements(t, "UPDATE", "saga_place_order")
		ids := []string{b.start(t, "o-1"), b.start(t, "o-2")}
		s := b.stagedBatch(t)
		count := func(sql string) int {
			t.Helper()
			var n int
			require.NoError(t, s.tx.QueryRow(s.ctx, sql, ids).Scan(&n))
			return n
		}
		const auditRows = `SELECT count(*) FROM saga_audit WHERE saga_id = ANY($1::uuid[])`
		const outboxRows = `SELECT count(*) FROM saga_outbox WHERE saga_id = ANY($1::text[])`
		const stored = `SELECT count(*) FROM saga_place_order WHERE id = ANY($1::uuid[]) AND version = 1`
		for _, id := range ids {
			st := b.status(t, id)
			require.NoError(t, s.reply(id, st.BusinessKey, st.PendingMessageID, msgInventoryReserved))
		}
		// Reads in the same transaction find o-1 where its transition left
		// it, though the database does not have it yet: an operator's
		// note, and a second message for it in the same batch.
		var stored1 int64
		require.NoError(t, s.tx.QueryRow(s.ctx, `SELECT version FROM saga_place_order WHERE id = $1`, ids[0]).Scan(&stored1))
		require.EqualValues(t, 1, stored1, "nothing written yet")
		noted, err := b.engine.NoteTx(s.ctx, s.btx, saga.Note{SagaID: ids[0], Trigger: "test.note",
			Operator: "tester", Reason: "read the staged row"})
		require.NoError(t, err)
		require.Equal(t, "AUTHORIZE_PAYMENT", noted.State)
		require.EqualValues(t, 2, noted.Version)
		require.NoError(t, s.reply(ids[0], noted.BusinessKey, noted.PendingMessageID, msgPaymentAuthorized))

		require.Equal(t, 2, count(auditRows), "only the starts' rows before the stage is flushed")
		require.Equal(t, 2, count(outboxRows), "only the starts' commands before the stage is flushed")
		require.Equal(t, 2, count(stored), "both instances at their first version before the flush")
		require.NoError(t, s.stage.Flush(s.ctx))
		require.Equal(t, 6, count(auditRows))
		require.Equal(t, 5, count(outboxRows))
		require.Zero(t, count(stored))
		require.NoError(t, s.tx.Commit(s.ctx))
		require.NoError(t, s.wakes.Send(s.ctx, b.pool))

		require.Equal(t, 3, audits(), "one per start, then one for the batch's three transitions and the note")
		require.Equal(t, 1, updates(), "the batch's three transitions of two instances: one statement")
		one, two := b.status(t, ids[0]), b.status(t, ids[1])
		require.Equal(t, "SCHEDULE_SHIPPING", one.State)
		require.EqualValues(t, 3, one.Version)
		require.Equal(t, "AUTHORIZE_PAYMENT", two.State)
		require.EqualValues(t, 2, two.Version)
		require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "InventoryReserved:new:RESERVE_INVENTORY>AUTHORIZE_PAYMENT",
			"test.note:new:AUTHORIZE_PAYMENT>AUTHORIZE_PAYMENT", "PaymentAuthorized:new:AUTHORIZE_PAYMENT>SCHEDULE_SHIPPING"},
			trail(b.history(t, ids[0])))
		require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping"}, outboxTypes(b.outbox(t, ids[0])))
		require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, ids[1])))
	})

	t.Run("TheVersionGuardHolds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defOptions{})
		id := b.start(t, "o-1")
		st := b.status(t, id)
		s := b.stagedBatch(t)
		require.NoError(t, s.reply(id, st.BusinessKey, st.PendingMessageID, msgInventoryReserved))
		// A write the engine did not make (it holds the row lock, so only
		// its own transaction could): the staged update must not
		// overwrite it.
		_, err := s.tx.Exec(s.ctx, `UPDATE saga_place_order SET version = version + 5 WHERE id = $1`, id)
		require.NoError(t, err)
		err = s.stage.Flush(s.ctx)
		require.ErrorContains(t, err, "0 matched their stored version")
		require.ErrorContains(t, err, id)
	})
}

// TestBatchLockedAhead: on a consumer's fast path HandleBatch locks every
// instance the batch's deliveries name, in one statement; the handlers then
// use those rows.
func TestBatchLockedAhead(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ids := []string{b.start(t, "o-1"), b.start(t, "o-2"), b.start(t, "o-3")}
	// The batch's transaction counts the instance locks it sends.
	cfg := b.pool.Config()
	locks := &lockCounter{}
	cfg.ConnConfig.Tracer = locks
	traced, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	s := b.stagedBatchOn(t, traced)
	statuses := make([]saga.Status, len(ids))
	for i, id := range ids[:2] { // o-3 is not in the batch
		statuses[i] = b.status(t, id)
		s.batch = append(s.batch, &consumer.Delivery{Envelope: message.Envelope{SagaID: id, SagaType: b.def.Name}})
	}
	s.batch = append(s.batch, &consumer.Delivery{Envelope: message.Envelope{SagaID: newID(), SagaType: "other.Saga"}})
	require.NoError(t, b.engine.LockBatchForTest(s.ctx, s.btx, s.batch))
	require.NoError(t, s.reply(ids[0], statuses[0].BusinessKey, statuses[0].PendingMessageID, msgInventoryReserved))
	locked := func(id string) bool {
		t.Helper()
		_, err := b.pool.Exec(context.Background(), `SELECT 1 FROM saga_place_order WHERE id = $1 FOR UPDATE NOWAIT`, id)
		if err == nil {
			return false
		}
		require.ErrorContains(t, err, "55P03")
		return true
	}
	require.True(t, locked(ids[1]), "o-2 was locked with o-1, before its own handler ran")
	require.True(t, locked(ids[0]))
	require.False(t, locked(ids[2]), "o-3 is not in the batch")
	require.NoError(t, s.reply(ids[1], statuses[1].BusinessKey, statuses[1].PendingMessageID, msgInventoryReserved))
	require.Equal(t, lockCount{many: 1}, locks.count(),
		"one statement locked both; neither handler locked its instance again")
	require.NoError(t, s.stage.Flush(s.ctx))
	require.NoError(t, s.tx.Commit(s.ctx))
	for _, id := range ids[:2] {
		require.Equal(t, "AUTHORIZE_PAYMENT", b.status(t, id).State)
	}
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, ids[2]).State)

	// The control: without the batch's locks the engine locks by id, and the counter
	// sees that statement (so the zero above is not a pattern that stopped
	// matching).
	alone := b.stagedBatchOn(t, traced)
	st := b.status(t, ids[2])
	require.NoError(t, alone.reply(ids[2], st.BusinessKey, st.PendingMessageID, msgInventoryReserved))
	require.Equal(t, lockCount{one: 1, many: 1}, locks.count())
}

// lockCounter is a pgx tracer counting the instance locks a connection
// sends, alone or in a batch: one by id, or many at once.
type lockCounter struct {
	mu sync.Mutex
	n  lockCount
}

type lockCount struct{ one, many int }

func (c *lockCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.note(d.SQL)
	return ctx
}

func (c *lockCounter) note(sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.Contains(sql, "WHERE id = $1::uuid FOR UPDATE"):
		c.n.one++
	case strings.Contains(sql, "t WHERE t.id = ks.k FOR UPDATE) AS x"):
		c.n.many++
	}
}

func (*lockCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (*lockCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *lockCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.note(d.SQL)
}

func (*lockCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *lockCounter) count() lockCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
