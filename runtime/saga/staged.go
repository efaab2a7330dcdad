package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// On a consumer's fast path (a txq.Stage) the instance updates of all the
// batch's transitions of one saga type are written by one statement before
// the commit, like the outbox and audit rows. Every row they update was
// locked by the handler that moved it (SELECT … FOR UPDATE), so nothing
// else can change it meanwhile; the version guard stays in the statement
// anyway. Until the flush the database holds the old row, so every read of
// an instance inside the transaction goes through loadIn, which returns the
// staged row instead.

// updatesKey names an engine table's part of a txq.Stage.
type updatesKey struct{ table string }

// stagedUpdates is the instance updates of one table staged in one
// transaction: per saga, the row as it will be, and the version the
// database holds (the guard).
type stagedUpdates struct {
	sql     string // updateMany
	one     string // update, for a batch of one
	rows    map[string]*stagedRow
	order   []string
	results []txq.Result
}

type stagedRow struct {
	w      row   // the row after its last staged transition
	stored int64 // the version in the database
}

// stagedUpdatesFor returns the engine's part of ctx's stage for tx, or nil
// when there is none.
func (e *Engine) stagedUpdatesFor(ctx context.Context, tx pgx.Tx) *stagedUpdates {
	p, ok := txq.PartFor(tx, updatesKey{e.table}, func() txq.Part {
		return &stagedUpdates{sql: e.q.updateMany, one: e.q.update, rows: map[string]*stagedRow{}}
	})
	if !ok {
		return nil
	}
	return p.(*stagedUpdates)
}

// loadIn runs an instance query in tx and returns the row as this
// transaction will have it: a row with a staged update is returned as
// updated. On a consumer's fast path, locks by id are answered from the
// rows HandleBatch locked for the batch.
func (e *Engine) loadIn(ctx context.Context, tx pgx.Tx, sql, arg string) (row, error) {
	var (
		w     row
		found bool
	)
	if sql == e.q.lockByID {
		if p, ok := txq.PartIf(tx, prefetchKey{e.table}); ok {
			if id, perr := uuid.Parse(arg); perr == nil {
				w, found = p.(*prefetched).rows[id.String()]
			}
		}
	}
	if !found {
		var err error
		if w, err = loadRow(ctx, tx, sql, arg); err != nil {
			return w, err
		}
	}
	if p, ok := txq.PartIf(tx, updatesKey{e.table}); ok {
		if s := p.(*stagedUpdates).rows[w.ID]; s != nil {
			return s.w, nil
		}
	}
	return w, nil
}

// stage records the update of w to after (version+1) for the flush.
func (s *stagedUpdates) stage(w row, after sagadef.Instance, enc encoded, version int64, now time.Time, result txq.Result) {
	next := w
	next.State, next.Version, next.Data, next.Attempt = after.State, version, enc.Data, after.Attempt
	next.PendingID, next.Progress, next.LastError, next.ReviewReason = after.PendingMessageID, enc.Progress, after.LastError, after.ReviewReason
	next.TimeoutAt, next.DeadlineAt = micros(enc.TimeoutAt), micros(enc.DeadlineAt)
	next.UpdatedAt = now.Truncate(time.Microsecond)
	if r := s.rows[w.ID]; r != nil {
		r.w = next
	} else {
		s.rows[w.ID] = &stagedRow{w: next, stored: w.Version}
		s.order = append(s.order, w.ID)
	}
	s.results = append(s.results, result)
}

// micros is t as PostgreSQL stores it.
func micros(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	m := t.Truncate(time.Microsecond)
	return &m
}

func (s *stagedUpdates) Queue(ctx context.Context, tx pgx.Tx) {
	n := len(s.order)
	var (
		ids, states, pendings, progress, lastErrors, reviews = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		stored, versions                                     = make([]int64, n), make([]int64, n)
		data                                                 = make([][]byte, n)
		attempts                                             = make([]int32, n)
		timeouts, deadlines                                  = make([]*time.Time, n), make([]*time.Time, n)
		updated                                              = make([]time.Time, n)
	)
	for i, id := range s.order {
		r := s.rows[id]
		w := r.w
		ids[i], stored[i], states[i], versions[i], data[i], attempts[i] = id, r.stored, w.State, w.Version, w.Data, int32(w.Attempt)
		pendings[i], progress[i], timeouts[i], deadlines[i] = w.PendingID, string(w.Progress), w.TimeoutAt, w.DeadlineAt
		lastErrors[i], reviews[i], updated[i] = w.LastError, w.ReviewReason, w.UpdatedAt
	}
	results := txq.Results(s.results)
	check := func(tag pgconn.CommandTag, err error) error {
		if err == nil && tag.RowsAffected() != int64(n) {
			// Only possible when a caller wrote a row it staged without
			// the engine: the guard refuses to overwrite it.
			err = retry.Transient(fmt.Errorf("update %d sagas: %d matched their stored version (first %s)",
				n, tag.RowsAffected(), ids[0]))
		}
		return results(tag, err)
	}
	if n == 1 {
		// One row by its primary key: planned as an index lookup whatever
		// the table's statistics.
		_ = txq.Exec(ctx, tx, check, s.one, ids[0], stored[0], states[0], versions[0], data[0], attempts[0],
			pendings[0], progress[0], timeouts[0], deadlines[0], lastErrors[0], reviews[0], updated[0])
		return
	}
	// Many rows: the join's plan is kept from a sequential scan (see
	// noSeqScanSQL), in the same round trip.
	_ = txq.Exec(ctx, tx, noResult("plan the batch's instance update"), noSeqScanSQL)
	_ = txq.Exec(ctx, tx, check, s.sql, ids, stored, states, versions, data, attempts, pendings, progress, timeouts, deadlines,
		lastErrors, reviews, updated)
	_ = txq.Exec(ctx, tx, noResult("restore enable_seqscan after the batch's instance update"), restoreSeqScanSQL)
}

// noSeqScanSQL and restoreSeqScanSQL surround the update of many instances.
// Its join of the table with the batch's arrays is planned as a hash join
// over a sequential scan of the whole table while the table has never been
// analyzed (the planner takes it for 10 pages), and a prepared statement
// keeps that generic plan as the table grows, until autovacuum analyzes it.
// With sequential scans disabled while it is planned, the table's side is
// the primary key's bitmap scan on "t.id = ANY($1)", whatever the
// statistics (TestBatchStatementsOnANewTable). The setting is local to the
// transaction, and the second statement puts back the value it had before
// (a handler's own SET LOCAL included).
const (
	noSeqScanSQL = `SELECT set_config('saga.enable_seqscan', current_setting('enable_seqscan'), true),
  set_config('enable_seqscan', 'off', true)`
	restoreSeqScanSQL = `SELECT set_config('enable_seqscan', current_setting('saga.enable_seqscan'), true)`
)

// noResult is the result check of a statement whose rows nobody reads.
func noResult(what string) txq.Result {
	return func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

func (s *stagedUpdates) Discard(err error) { _ = txq.Results(s.results)(pgconn.CommandTag{}, err) }

// prefetchKey names an engine table's rows locked ahead in a txq.Stage.
type prefetchKey struct{ table string }

// prefetched is the instances of one table locked for a batch in one
// statement, by id, as stored, and which of the batch's unclaimed
// deliveries the inbox already names (see Engine.handledBefore). It writes
// nothing.
type prefetched struct {
	rows     map[string]row
	consumer string          // the consumer claimed is read for ("": not read)
	claimed  map[string]bool // message ids consumer has claimed
}

func (*prefetched) Queue(context.Context, pgx.Tx) {}
func (*prefetched) Discard(error)                 {}

// HandleBatch is the engine as a [consumer.BatchHandler]: a consumer of its
// saga's queue hands it each batch. It locks, in one statement and in id
// order (so that two batches lock in the same order), the instances of its
// saga type that the deliveries name, and leaves them on the batch's
// transaction; then it applies each delivery with [Engine.Handle], which
// finds its instance there instead of locking the row by itself, and stages
// the instance update, the outbox rows and the audit row, which the consumer
// writes with the whole batch's, one statement per kind. With fewer than two
// instances to lock, or on a transaction that is not a consumer batch's, it
// locks nothing ahead. When the consumer claimed nothing in the inbox
// (consumer.Delivery.Unclaimed), the read of which deliveries the inbox
// names goes in the same round trip. A failed lock statement fails the
// batch as a whole ([consumer.FailBatch]).
func (e *Engine) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
	if err := e.lockBatch(ctx, tx, ds); err != nil {
		return consumer.FailBatch(ds, err)
	}
	return consumer.HandlerFunc(e.Handle).HandleBatch(ctx, tx, ds)
}

// lockBatch locks the instances ds name for HandleBatch, and reads which
// unclaimed deliveries the inbox names.
func (e *Engine) lockBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) error {
	var ids, unclaimed []string
	name := ""
	for _, d := range ds {
		if d.Unclaimed != "" && d.Envelope.MessageID != "" {
			name = d.Unclaimed // one consumer hands over the batch
			unclaimed = append(unclaimed, d.Envelope.MessageID)
		}
		if d.Envelope.SagaType != e.def.Name {
			continue
		}
		if id, err := uuid.Parse(d.Envelope.SagaID); err == nil {
			ids = append(ids, id.String())
		}
	}
	if len(ids) < 2 && len(unclaimed) < 2 {
		return nil
	}
	part, ok := txq.PartFor(tx, prefetchKey{e.table}, func() txq.Part { return &prefetched{} })
	if !ok {
		return nil
	}
	p := part.(*prefetched)
	var (
		b  pgx.Batch
		ws []row
	)
	if len(ids) >= 2 {
		b.Queue(e.q.lockMany, ids).Query(func(rows pgx.Rows) error {
			var err error
			ws, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) { return scanRow(r) })
			if err != nil {
				return fmt.Errorf("lock the batch's %d saga %s instances: %w", len(ids), e.def.Name, err)
			}
			return nil
		})
	}
	if len(unclaimed) > 0 {
		p.consumer, p.claimed = name, map[string]bool{}
		inbox.QueueClaimed(&b, name, unclaimed, p.claimed)
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		p.consumer, p.claimed = "", nil
		if len(ids) >= 2 {
			return fmt.Errorf("lock the batch's %d saga %s instances: %w", len(ids), e.def.Name, err)
		}
		return err
	}
	p.rows = make(map[string]row, len(ws))
	for _, w := range ws {
		p.rows[w.ID] = w
	}
	return nil
}
