package saga_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/internal/txq"
)

// TestStagedAuditRows: in a consumer's fast path (a txq.Stage for the batch
// transaction) the audit rows of all the batch's transitions are written by
// one statement when the stage is flushed, in the order of the
// transitions, and not before; the outbox rows likewise.
func TestStagedAuditRows(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
CREATE TABLE audit_inserts (n int NOT NULL);
INSERT INTO audit_inserts VALUES (0);
CREATE FUNCTION count_audit_insert() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE audit_inserts SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER count_audit_insert AFTER INSERT ON saga_audit
  FOR EACH STATEMENT EXECUTE FUNCTION count_audit_insert();`)
	require.NoError(t, err)
	ids := []string{b.start(t, "o-1"), b.start(t, "o-2")}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	count := func(sql string) int {
		t.Helper()
		var n int
		require.NoError(t, tx.QueryRow(ctx, sql, ids).Scan(&n))
		return n
	}
	const audits = `SELECT count(*) FROM saga_audit WHERE saga_id = ANY($1::uuid[])`
	const outbox = `SELECT count(*) FROM saga_outbox WHERE saga_id = ANY($1::text[])`
	wakes := txq.NewWakes(tx)
	stage := txq.NewStage(tx, wakes)
	for _, id := range ids {
		st := b.status(t, id)
		env, err := envelope.New(msg(msgInventoryReserved, st.BusinessKey),
			envelope.Meta{SagaID: id, SagaType: b.def.Name, CausationID: st.PendingMessageID})
		require.NoError(t, err)
		d := &consumer.Delivery{Envelope: env, Message: msg(msgInventoryReserved, st.BusinessKey), Queue: "test.replies", Attempt: 1}
		// As the consumer runs a handler: a scope of its own, the stage
		// of the batch.
		hctx, scope := txq.WithScope(stage.Attach(wakes.Attach(ctx)), tx)
		scope.CommitsWith(wakes)
		require.NoError(t, b.engine.Handle(hctx, tx, d))
		require.NoError(t, scope.Flush(hctx))
		scope.Keep()
	}
	require.Equal(t, 2, count(audits), "only the starts' rows before the stage is flushed")
	require.Equal(t, 2, count(outbox), "only the starts' commands before the stage is flushed")
	require.NoError(t, stage.Flush(ctx))
	require.Equal(t, 4, count(audits))
	require.Equal(t, 4, count(outbox))
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, wakes.Send(ctx, b.pool))

	var statements int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT n FROM audit_inserts`).Scan(&statements))
	require.Equal(t, 3, statements, "one per start, then one for the batch's two transitions")
	for _, id := range ids {
		require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "InventoryReserved:new:RESERVE_INVENTORY>AUTHORIZE_PAYMENT"},
			trail(b.history(t, id)))
		require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
	}
}
