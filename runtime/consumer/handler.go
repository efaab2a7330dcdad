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

// runHandler runs the handler of it on tx (which carries the batch's wake
// set, and its stage on the fast path) with a write scope, sends the
// writes it queued, and checks it left the transaction usable. The
// handler's after-commit work (the outbox's hand-off to a local relay) goes
// to the wake set only when it succeeded: its writes then commit with the
// batch's transaction, or not at all (a failure after this point fails the
// whole transaction, and the wake set is dropped with it).
func (c *Consumer) runHandler(ctx context.Context, tx *txq.Tx, it *item) error {
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
	err := txq.Run(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		return c.callHandler(ctx, tx, it.d)
	})
	if errors.Is(err, txq.ErrAborted) {
		return fmt.Errorf("handler %w", err)
	}
	return err
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

// apply claims the item in the inbox and runs the handler, in a savepoint
// of tx. A handler error rolls the savepoint back and routes the item; an
// error returned by apply means tx itself is unusable.
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, it *item, wakes *txq.Wakes) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin savepoint: %w", err)
	}
	first, err := inbox.Claim(ctx, sp, c.cfg.Name, it.d.Envelope.MessageID)
	if err != nil {
		return err
	}
	if !first {
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		it.outcome = outcomeDuplicate
		c.log.Debug("duplicate message acknowledged without effect", slog.String("message_id", it.messageID()))
		return nil
	}
	herr := c.runHandler(it.handlerContext(ctx), txq.New(sp, wakes, nil), it)
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

// lockBatch runs the LockBatch function on the batch's transaction,
// turning a panic into an error.
func (c *Consumer) lockBatch(ctx context.Context, tx pgx.Tx, ds []*Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "LockBatch panicked", slog.Int("batch", len(ds)),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("lock batch of %d (first message %s): panic: %v", len(ds), ds[0].Envelope.MessageID, r)
		}
	}()
	if err := c.cfg.LockBatch(ctx, tx, ds); err != nil {
		return fmt.Errorf("lock batch of %d (first message %s): %w", len(ds), ds[0].Envelope.MessageID, err)
	}
	return nil
}

// callHandler runs the handler, turning a panic into an unclassified error.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "handler panicked", slog.String("message_id", d.Envelope.MessageID),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return c.cfg.Handler(ctx, tx, d)
}
