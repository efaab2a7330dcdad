package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/retry"
)

// insertAllParked records every item to park in saga_parked.
func (c *Consumer) insertAllParked(ctx context.Context, tx pgx.Tx, items []*item) error {
	for _, it := range items {
		if it.outcome != outcomePark {
			continue
		}
		if err := c.insertParked(ctx, tx, it); err != nil {
			return fmt.Errorf("message %q: %w", it.messageID(), err)
		}
	}
	return nil
}

// refused returns the failure of a delivery the consumer does not hand to
// the handler (one whose handling stopped the consumer before), or nil.
// Such a delivery is a suspect, always handled alone.
func (c *Consumer) refused(it *item) error {
	if it.stoppedBefore && it.failedBefore != "" {
		it.reason = "redelivered"
		return retry.Permanent(fmt.Errorf("redelivered %d times without an acknowledgement (MaxRedeliveries %d), "+
			"and handling it alone failed %d times in a row with a database error that ends the session: %s: not run again",
			it.redeliveries, c.cfg.MaxRedeliveries, maxSpared+1, it.failedBefore))
	}
	if it.stoppedBefore {
		// Not a duplicate (its inbox claim was the first), and its last
		// handling never finished: do not risk it again.
		it.reason = "redelivered"
		return retry.Permanent(fmt.Errorf("redelivered %d times without an acknowledgement (MaxRedeliveries %d), "+
			"and handling it alone stopped the consumer before: not run again", it.redeliveries, c.cfg.MaxRedeliveries))
	}
	return nil
}

// handleBatch hands the deliveries of its to the batch handler on tx (which
// carries the batch's wake set, and its stage on the fast path) and returns
// its errors: nil when every delivery succeeded, else one per delivery. A
// panic outside any one delivery's handler fails the batch (or the
// delivery, when it is alone); a handler's recovered panic is logged here.
func (c *Consumer) handleBatch(ctx context.Context, tx pgx.Tx, its []*item) (errs []error) {
	ds := make([]*Delivery, len(its))
	for i, it := range its {
		it.d.ctx = it.ctx
		ds[i] = it.d
	}
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "batch handler panicked", slog.Int("batch", len(ds)),
				slog.String("first_message_id", ds[0].Envelope.MessageID),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			errs = c.batchFailed(ds, fmt.Errorf("panic: %v", r))
		}
	}()
	errs = c.batch.HandleBatch(ctx, tx, ds)
	if errs == nil {
		return nil
	}
	if len(errs) != len(ds) {
		return c.batchFailed(ds, fmt.Errorf("batch handler returned %d errors for %d deliveries", len(errs), len(ds)))
	}
	for i, err := range errs {
		var pe *panicError
		if errors.As(err, &pe) {
			c.log.ErrorContext(ds[i].Context(ctx), "handler panicked", slog.String("message_id", ds[i].Envelope.MessageID),
				slog.Any("panic", pe.value), slog.String("stack", string(pe.stack)))
		}
	}
	return errs
}

// batchFailed is the errors of a batch that failed as a whole with err:
// the one delivery's error when it is alone, else [FailBatch]'s.
func (c *Consumer) batchFailed(ds []*Delivery, err error) []error {
	if len(ds) == 1 {
		return []error{err}
	}
	return FailBatch(ds, err)
}

// handleAlone runs the handler of it alone on tx, a savepoint, and
// returns its error; a handler that returned success on an aborted
// transaction fails.
func (c *Consumer) handleAlone(ctx context.Context, tx pgx.Tx, it *item) error {
	if err := c.refused(it); err != nil {
		return err
	}
	errs := c.handleBatch(ctx, tx, []*item{it})
	if errs != nil {
		return errs[0]
	}
	if tx.Conn().PgConn().TxStatus() == 'E' {
		return fmt.Errorf("handler %w", txq.ErrAborted)
	}
	return nil
}

// guardedTx is the batch transaction as a fast-path handler sees it: it
// cannot commit or roll back the batch (that would commit or undo the other
// deliveries' work); trying is recorded and fails.
type guardedTx struct {
	pgx.Tx
	closed bool
	// stage is the batch's staged writes. A savepoint a handler begins
	// is a transaction of its own to the code that runs in it, which
	// would not see them, so they are written first; stageErr is why
	// that failed.
	stage    *txq.Stage
	stageErr error
}

// Begin writes the batch's staged rows, then begins a savepoint.
func (g *guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := g.stage.Flush(ctx); err != nil {
		g.stageErr = err
		return nil, fmt.Errorf("write the batch's staged rows before a savepoint: %w", err)
	}
	return g.Tx.Begin(ctx)
}

var errHandlerClosedTx = errors.New("a handler must not commit or roll back the transaction it was given")

func (g *guardedTx) Commit(context.Context) error {
	g.closed = true
	return errHandlerClosedTx
}

func (g *guardedTx) Rollback(context.Context) error {
	g.closed = true
	return errHandlerClosedTx
}

// apply claims the item in the inbox (unless the handler dedupes) and runs
// the handler, in a savepoint
// of tx. A handler error rolls the savepoint back and routes the item; an
// error returned by apply means tx itself is unusable.
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, it *item, wakes *txq.Wakes) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin savepoint: %w", err)
	}
	first := true
	if !c.cfg.HandlerDedupes {
		first, err = inbox.Claim(ctx, sp, c.cfg.Name, it.d.Envelope.MessageID)
		if err != nil {
			return err
		}
	}
	if !first {
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		it.outcome = outcomeDuplicate
		c.log.Debug("duplicate message acknowledged without effect", slog.String("message_id", it.messageID()))
		return nil
	}
	herr := c.handleAlone(ctx, txq.New(sp, wakes, nil), it)
	if herr == nil {
		if err := sp.Commit(ctx); err != nil {
			if errors.Is(err, pgx.ErrTxClosed) {
				return &deliveryFault{err: errors.New("handler committed or rolled back the transaction it was given")}
			}
			return fmt.Errorf("release savepoint: %w", err)
		}
		it.outcome = outcomeDone
		return nil
	}
	if ctx.Err() != nil {
		// Shutdown gave up on this delivery: leave it for redelivery
		// rather than spend one of its attempts.
		return fmt.Errorf("handler interrupted: %w", herr)
	}
	if err := sp.Rollback(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxClosed) {
			return &deliveryFault{err: fmt.Errorf("handler closed the transaction it was given and failed: %w", herr)}
		}
		return fmt.Errorf("roll back savepoint after handler error (%v): %w", herr, err)
	}
	it.fail(fmt.Errorf("handler: %w", herr), c.cfg.Retry)
	return nil
}
