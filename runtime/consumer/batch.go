package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
)

// BatchHandler applies the deliveries of one batch in one transaction. The
// saga engine (saga.Engine) and the participant glue
// (participant.BatchHandler) implement it: they take the locks the whole
// batch needs in one statement, then apply each delivery. A [HandlerFunc] is
// a BatchHandler that applies each delivery in turn.
//
// On its fast path the consumer hands HandleBatch every delivery it claimed
// first in the inbox, in order, on the batch's transaction (a
// runtime/internal/txq.Tx carrying the batch's stage and wake set): the
// instance updates, outbox rows and audit rows the deliveries stage there
// are written by one statement per kind once all are applied (by
// HandlerFunc.HandleBatch, or by the consumer after HandleBatch returns),
// before the commit.
// When the handler fails, the consumer rolls the transaction back and
// applies the batch again one delivery at a time, each in a savepoint of
// its own, calling HandleBatch with that one delivery.
//
// HandleBatch returns nil when every delivery succeeded, or one error per
// delivery: nil for a delivery that succeeded, its failure (routed by its
// class, as a [HandlerFunc]'s error) for the first that failed, and
// [ErrSkipped] for those after it, which the handler need not run (a
// failure may have aborted the transaction). A failure of a statement for
// the whole batch, which no delivery can be blamed for, is [FailBatch]'s
// answer: the consumer then charges no delivery an attempt. The errors
// slice must have len(ds) entries; the ds slice is the consumer's: do not
// keep or modify it. Everything HandleBatch does to the database goes
// through tx; it must neither commit nor roll tx back.
type BatchHandler interface {
	HandleBatch(ctx context.Context, tx pgx.Tx, ds []*Delivery) []error
}

// ErrSkipped is the error of a delivery a [BatchHandler] did not apply
// because one before it failed.
var ErrSkipped = errors.New("not applied: an earlier delivery of the batch failed")

// BatchError is the failure of a statement for a whole batch (its locks,
// its idempotency keys), which no one delivery is to blame for.
type BatchError struct{ Err error }

func (e *BatchError) Error() string { return "batch: " + e.Err.Error() }
func (e *BatchError) Unwrap() error { return e.Err }

// FailBatch returns the errors a [BatchHandler] returns when a statement for
// the whole batch failed with err: a [BatchError] for every delivery.
func FailBatch(ds []*Delivery, err error) []error {
	errs := make([]error, len(ds))
	for i := range errs {
		errs[i] = &BatchError{Err: err}
	}
	return errs
}

// HandleBatch makes a HandlerFunc a [BatchHandler]: it runs f for each
// delivery in turn, in the delivery's context ([Delivery.Context]) and in a
// write scope of its own (runtime/internal/txq.Run: the writes f queued are
// sent as one pipeline when it returns, and its after-commit work is kept
// only when it succeeded), and stops at the first failure. A panic in f is
// that delivery's unclassified error. When every delivery succeeded, it
// writes the rows they staged on tx (on the consumer's fast path: instance
// updates, outbox rows, audit rows), one statement per kind; a failure there
// fails the batch ([FailBatch]).
func (f HandlerFunc) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*Delivery) []error {
	for i, d := range ds {
		err := txq.Run(d.Context(ctx), tx, func(ctx context.Context, tx pgx.Tx) error {
			return f.call(ctx, tx, d)
		})
		if err == nil {
			continue
		}
		if errors.Is(err, txq.ErrAborted) {
			err = fmt.Errorf("handler %w", err)
		}
		errs := make([]error, len(ds))
		errs[i] = err
		for j := i + 1; j < len(ds); j++ {
			errs[j] = ErrSkipped
		}
		return errs
	}
	// The rows the deliveries staged (instance updates, outbox and audit
	// rows), one statement per kind. Which delivery's row made it fail is
	// not known: the batch's failure.
	if err := txq.FlushStage(ctx, tx); err != nil {
		return FailBatch(ds, fmt.Errorf("write the batch's staged rows: %w", err))
	}
	return nil
}

// call runs f, turning a panic into a *panicError.
func (f HandlerFunc) call(ctx context.Context, tx pgx.Tx, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return f(ctx, tx, d)
}

// panicError is a handler's recovered panic; the consumer logs its stack.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// Context returns the context d is handled in (the consumer's process span
// for it), or parent when the consumer made none (telemetry off).
func (d *Delivery) Context(parent context.Context) context.Context {
	if d.ctx != nil {
		return d.ctx
	}
	return parent
}
