package txq

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Stage carries writes that many handlers of one transaction append to the
// same table — outbox rows, audit rows — past the end of each handler, so
// that they go to the database as one multi-row statement per kind when the
// owner flushes the stage before committing, instead of one statement per
// handler. A row PostgreSQL inserts with 63 others costs it a fraction of
// what a row inserted alone does (docs/benchmarks.md).
//
// Only the consumer's fast path makes a stage: there every handler's work
// commits or the whole transaction rolls back, so no handler's staged rows
// can outlive its failure. The price is that an error in a staged statement
// (a duplicate message id, say) is the batch's, not one delivery's: the
// owner rolls back and applies the batch again with a savepoint per
// delivery, where nothing is staged and each statement's error is its
// handler's.
//
// Staged rows are written only at the flush: whoever reads them in the
// transaction before must read the part (the saga engine does, for its
// instances: see [PartIf]). [Sync] does not flush a stage. The consumer
// hands the stage to its handlers on the batch's [Tx] ([New]).
type Stage struct {
	tx    pgx.Tx
	wakes *Wakes
	parts []keyed[Part]
}

// Part is one kind of staged write: the rows handlers added, sent as one
// statement (or a few) when the stage is flushed.
type Part interface {
	// Queue queues the part's statements with txq's Exec or Query on tx:
	// tx has a scope that commits with the stage's wake set, so
	// AfterCommit and CollectorFor work as in a handler.
	Queue(ctx context.Context, tx pgx.Tx)
	// Discard tells the part its rows will not be written (the
	// transaction rolls back), so it can end what waits for them.
	Discard(err error)
}

// NewStage returns an empty stage for tx whose work after the commit runs
// with w. The caller owns it: it must Flush it before committing, and
// Discard it when the transaction rolls back.
func NewStage(tx pgx.Tx, w *Wakes) *Stage { return &Stage{tx: tx, wakes: w} }

// PartFor returns the part registered under key in tx's stage, made by
// newPart on first use. It reports false when tx carries no stage (a
// savepoint, a transaction of the handler's own, no consumer): the caller
// writes as usual then.
func PartFor(tx pgx.Tx, key any, newPart func() Part) (Part, bool) {
	st := stageOf(tx)
	if st == nil {
		return nil, false
	}
	return lookup(&st.parts, key, newPart), true
}

// stageOf returns tx's stage, or nil.
func stageOf(tx pgx.Tx) *Stage {
	if t := of(tx); t != nil {
		return t.stage
	}
	return nil
}

// PartIf returns the part registered under key in tx's stage, if there is
// one.
func PartIf(tx pgx.Tx, key any) (Part, bool) {
	st := stageOf(tx)
	if st == nil {
		return nil, false
	}
	return find(st.parts, key)
}

// Flush sends every part's statements as one pipeline, in the order the
// parts were first used, and keeps their after-commit work. The stage is
// empty afterwards; an error means the transaction is unusable.
func (st *Stage) Flush(ctx context.Context) error {
	parts := st.parts
	st.parts = nil
	if len(parts) == 0 {
		return nil
	}
	// The parts' own writes are not staged again: the flush's
	// transaction has a scope and no stage.
	tx, s := WithScope(New(st.tx, st.wakes, nil))
	for _, kp := range parts {
		kp.v.Queue(ctx, tx)
	}
	if err := s.Flush(ctx); err != nil {
		s.Discard(err)
		return err
	}
	s.Keep()
	return nil
}

// FlushStage flushes tx's stage ([Stage.Flush]), if it has one: a batch
// handler writes its batch's staged rows, one statement per kind, once it
// applied every delivery.
func FlushStage(ctx context.Context, tx pgx.Tx) error {
	if st := stageOf(tx); st != nil {
		return st.Flush(ctx)
	}
	return nil
}

// Discard drops the staged rows without writing them.
func (st *Stage) Discard(err error) {
	for _, kp := range st.parts {
		kp.v.Discard(err)
	}
	st.parts = nil
}
