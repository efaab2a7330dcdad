package saga

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Row is an instance row read without a lock, for tests that bypass the
// row lock to prove the version guard.
type Row = row

// SnapshotForTest reads the instance row without locking it.
func (e *Engine) SnapshotForTest(ctx context.Context, sagaID string) (Row, error) {
	return loadRow(ctx, e.cfg.Pool, e.q.selectByID, sagaID)
}

// TransitionForTest applies trig to a row the caller did not lock.
func (e *Engine) TransitionForTest(ctx context.Context, tx pgx.Tx, w Row, trig sagadef.Trigger) error {
	_, err := e.transition(ctx, tx, w, trig, origin{})
	return err
}

// ClaimDueSQLForTest is the scanner's claim of due instances: $1 the
// clock, $2 the limit, $3 the states it acts on.
func (e *Engine) ClaimDueSQLForTest() string { return e.q.claimDue }

// LockManySQLForTest locks a batch's instances: $1 their ids.
func (e *Engine) LockManySQLForTest() string { return e.q.lockMany }

// UpdateManySQLForTest writes a batch's staged instances: parallel arrays
// of ids, stored versions, states, versions, data, attempts, pending
// message ids, progress, timeouts, deadlines, last errors, review reasons
// and update times.
func (e *Engine) UpdateManySQLForTest() string { return e.q.updateMany }

// UpdateSQLForTest writes one staged instance (a batch of one).
func (e *Engine) UpdateSQLForTest() string { return e.q.update }

// NoSeqScanSQLForTest and RestoreSeqScanSQLForTest surround the update of
// many instances.
const (
	NoSeqScanSQLForTest      = noSeqScanSQL
	RestoreSeqScanSQLForTest = restoreSeqScanSQL
)

// ListSQLForTest is List's statement for f, and its arguments.
func (e *Engine) ListSQLForTest(f ListFilter) (string, []any, error) {
	sql, args, _, err := e.listSQL(f)
	return sql, args, err
}

// LockBatchForTest takes the locks HandleBatch takes ahead for ds, without
// handling them.
func (e *Engine) LockBatchForTest(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) error {
	return e.lockBatch(ctx, tx, ds)
}

// SagaGaugeSQLForTest is the saga gauges' query on table (quoted) counting
// states: $1, $2, $3 the stuck rule's Args.
func SagaGaugeSQLForTest(table string, states []string) string { return sagaGaugeSQL(table, states) }
