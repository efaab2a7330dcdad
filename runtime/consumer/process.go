package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/retry"
)

const (
	// outcomePending: decoded, not handled yet.
	outcomePending outcome = iota
	// outcomeDone: handled; its effects commit with the batch. Ack.
	outcomeDone
	// outcomeDuplicate: already handled before (inbox). Ack.
	outcomeDuplicate
	// outcomeRetry: failed; republish to a tier queue, then ack.
	outcomeRetry
	// outcomePark: failed for good; record and publish to the parking lot,
	// then ack.
	outcomePark
)

// commitError reports a failed COMMIT.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// serverRejected reports whether the server answered the commit with an
// error that belongs to the batch's content (a deferred constraint, a
// serialization failure), not to the database's availability: connection
// exceptions (08), an operator or shutdown intervention (57P), insufficient
// resources such as a full disk or memory (53), system and I/O errors (58),
// configuration file errors (F0) and internal errors (XX) are the
// database's, and charge no delivery an attempt.
func (e *commitError) serverRejected() bool {
	var pgErr *pgconn.PgError
	if !errors.As(e.err, &pgErr) {
		return false
	}
	for _, class := range [...]string{"08", "57P", "53", "58", "F0", "XX"} {
		if strings.HasPrefix(pgErr.Code, class) {
			return false
		}
	}
	return true
}

// deliveryFault reports a handler that broke the shared transaction in a
// way its savepoint cannot undo (it committed or rolled back the savepoint
// itself). The batch is rolled back and applied again one delivery per
// transaction; alone, the delivery is parked.
type deliveryFault struct{ err error }

func (e *deliveryFault) Error() string { return e.err.Error() }
func (e *deliveryFault) Unwrap() error { return e.err }

// handle takes a batch from decoding to acknowledgement, counting its
// deliveries as consumed when count is set. A non-nil error
// means some deliveries were left unacknowledged and the session must end
// so that they are redelivered.
func (s *session) handle(ctx context.Context, batch []amqp.Delivery, count bool) (err error) {
	c := s.c
	items := make([]*item, len(batch))
	for i := range batch {
		items[i] = c.decode(&batch[i])
	}
	if slices.ContainsFunc(items, c.overLimit) {
		if len(items) > 1 {
			return s.handleEach(ctx, batch, count)
		}
		if err := c.markSuspect(ctx, items[0]); err != nil {
			return err
		}
	}
	c.tel.begin(ctx, items, count)
	defer func() { c.tel.end(items, err) }()
	err = c.transact(ctx, items)
	var ce *commitError
	var fault *deliveryFault
	switch {
	case errors.As(err, &fault):
		if len(items) > 1 {
			c.log.Warn("a handler broke the batch transaction; applying its deliveries one by one",
				slog.Int("batch", len(items)), slog.Any("error", err))
			return s.handleEach(ctx, batch, false) // counted above
		}
		items[0].outcome = outcomePending
		items[0].reason = "handler_fault"
		items[0].fail(retry.Permanent(fault.err), c.cfg.Retry)
		err = c.transact(ctx, items)
	case errors.As(err, &ce) && ce.serverRejected():
		if len(items) > 1 {
			// One delivery's effects made the shared commit fail; find it by
			// applying them one by one.
			c.log.Warn("batch commit rejected; applying its deliveries one by one",
				slog.Int("batch", len(items)), slog.Any("error", err))
			return s.handleEach(ctx, batch, false) // counted above
		}
		it := items[0]
		if it.outcome != outcomeDone {
			return fmt.Errorf("message %q: %w", it.messageID(), err)
		}
		// The commit failure belongs to this delivery's handler.
		it.reason = "commit"
		it.fail(fmt.Errorf("commit handler effects: %w", ce.err), c.cfg.Retry)
		err = c.transact(ctx, items)
	}
	if err != nil {
		// A handling that ended with an error of its own (the database
		// went away, say), seen while nothing was cancelling it, did not
		// stop the consumer, whatever the row left behind says: clear the
		// row now if the database answers, before the delivery goes back
		// to the queue and to another process. A handling cancelled
		// because it hung past a drain is not remembered: that is what
		// the guard is for; nor one spared too often already (see
		// interruptedSet.add), whose next delivery is parked.
		if it := items[0]; it.suspect && ctx.Err() == nil {
			if c.interrupted.add(it.messageID(), err) {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), clearTimeout)
				c.clearInterrupted(cctx)
				cancel()
			} else {
				c.log.WarnContext(it.handlerContext(ctx), "message handled alone failed again after being spared twice; its next delivery is parked",
					slog.String("message_id", it.messageID()), slog.Int("redeliveries", it.redeliveries), slog.Any("error", err))
			}
		}
		return err
	}
	if c.afterCommit != nil {
		ids := make([]string, len(items))
		for i, it := range items {
			ids[i] = it.messageID()
		}
		if err := c.afterCommit(ids); err != nil {
			return &crashError{err: err}
		}
	}
	return s.finish(ctx, items)
}

// handleEach handles every delivery of batch in a transaction of its own;
// count is false when the deliveries were already counted as consumed (a
// batch split after it began).
func (s *session) handleEach(ctx context.Context, batch []amqp.Delivery, count bool) error {
	for i := range batch {
		if err := s.handle(ctx, batch[i:i+1], count); err != nil {
			return err
		}
	}
	return nil
}

// transact applies the batch in one transaction — the inbox claim and the
// handler of every pending item, and the saga_parked row of every item to
// park — and commits. An error means nothing committed.
//
// It first tries the fast path (transactFast) and falls back to a savepoint
// per delivery (transactEach) when a handler fails.
func (c *Consumer) transact(ctx context.Context, items []*item) error {
	pending, park := 0, 0
	for _, it := range items {
		switch it.outcome {
		case outcomePending:
			pending++
		case outcomePark:
			park++
		}
	}
	if pending+park == 0 {
		return c.clearSuspectsAlone(ctx, items)
	}
	if pending > 0 {
		err := c.transactFast(ctx, items)
		if !errors.Is(err, errFallBack) {
			if err == nil {
				c.fast.Add(1)
			}
			return err
		}
		c.fallBack.Add(1)
		c.tel.rolledBack(ctx, items)
	}
	return c.transactEach(ctx, items)
}

// errFallBack: the fast path rolled back; apply the batch with savepoints.
var errFallBack = errors.New("fall back to a savepoint per delivery")

// transactFast applies the batch without savepoints: one statement claims
// every pending delivery in the inbox, then the batch handler gets the
// deliveries claimed first, in the batch's transaction: it locks what they
// need in one statement and applies each, each one's queued writes sent as
// one pipeline when it returns (see runtime/internal/txq). This saves three
// round trips per delivery (SAVEPOINT, the claim, RELEASE) when every
// handler succeeds, which is the common case. The saga instance updates and the outbox and
// audit rows of every handler are staged (txq.Stage) and written by one
// statement per kind before the commit; if that fails, nothing tells which
// handler's row was at fault, so no attempt is charged and the batch goes
// down the savepoint path, where nothing is staged.
//
// The first delivery that fails ends the attempt: the transaction rolls
// back, that delivery keeps its failure (it is not run again), the others
// become pending again, and errFallBack tells transact to
// apply the batch with a savepoint per delivery, where no failure can undo
// another delivery's work. A handler that commits or rolls back the
// transaction is a deliveryFault, as on the savepoint path.
func (c *Consumer) transactFast(ctx context.Context, items []*item) error {
	return c.inTransaction(ctx, items, func(tx pgx.Tx, wakes *txq.Wakes) error {
		return c.applyFast(ctx, tx, wakes, items)
	})
}

func (c *Consumer) applyFast(ctx context.Context, tx pgx.Tx, wakes *txq.Wakes, items []*item) error {
	var pending []*item
	var ids []string
	for _, it := range items {
		if it.outcome == outcomePending {
			pending = append(pending, it)
			ids = append(ids, it.d.Envelope.MessageID)
		}
	}
	first, err := c.claimAll(ctx, tx, ids)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		// A deadlock with another batch claiming a redelivered message,
		// say: one claim per savepoint cannot deadlock that way.
		c.log.Debug("batch inbox claim failed; claiming one by one", slog.Any("error", err))
		return errFallBack
	}
	guard := &guardedTx{Tx: tx}
	stage := txq.NewStage(guard, wakes)
	guard.stage = stage
	btx := txq.New(guard, wakes, stage)
	// chargeNone sends the whole batch, rolled back, down the savepoint
	// path with no attempt charged: the failure was the batch's, not one
	// delivery's.
	chargeNone := func() error {
		for _, p := range pending {
			p.outcome = outcomePending
		}
		return errFallBack
	}
	// stagedFailed handles a failure to write the staged rows: which
	// handler's row was at fault is not known here, so no attempt is
	// charged and the savepoint path, where nothing is staged, applies the
	// batch again.
	stagedFailed := func(err error) error {
		if ctx.Err() != nil {
			return err
		}
		if rerr := tx.Rollback(ctx); rerr != nil {
			return fmt.Errorf("roll back after the batch's staged writes failed (%v): %w", err, rerr)
		}
		c.log.Debug("batch's staged writes failed; applying the batch again with a savepoint per delivery", slog.Any("error", err))
		return chargeNone()
	}
	// failed ends the attempt at its failure herr: the transaction rolls
	// back, it keeps its failure (it is not run again), and the others
	// are pending again.
	failed := func(it *item, herr error) error {
		stage.Discard(fmt.Errorf("rolled back with the batch after message %s failed: %w", it.messageID(), herr))
		if ctx.Err() != nil {
			return fmt.Errorf("message %q: handler interrupted: %w", it.messageID(), herr)
		}
		// As on the savepoint path, the failure is the delivery's only if
		// the database is still there to undo its work: a lost connection
		// spends no attempt.
		if err := tx.Rollback(ctx); err != nil {
			return fmt.Errorf("message %q: roll back after handler error (%v): %w", it.messageID(), herr, err)
		}
		if lockConflict(herr) {
			// The batch's inbox claims and the batch handler's first
			// statement hold locks for the whole batch, so a deadlock or
			// serialization failure here may be the batch's doing rather
			// than this delivery's: charge no attempt, the savepoint path
			// applies it again.
			return chargeNone()
		}
		for _, p := range pending {
			if p != it {
				p.outcome = outcomePending
			}
		}
		it.fail(fmt.Errorf("handler: %w", herr), c.cfg.Retry)
		return errFallBack
	}
	var run []*item
	for i, it := range pending {
		if !first[i] {
			it.outcome = outcomeDuplicate
			c.log.Debug("duplicate message acknowledged without effect", slog.String("message_id", it.messageID()))
			continue
		}
		if err := c.refused(it); err != nil {
			return failed(it, err)
		}
		run = append(run, it)
	}
	if len(run) > 0 {
		for _, it := range run {
			it.ranFast = true
		}
		errs := c.handleBatch(ctx, btx, run)
		if guard.closed {
			stage.Discard(errHandlerClosedTx)
			return &deliveryFault{err: errors.New("handler committed or rolled back the transaction it was given")}
		}
		if guard.stageErr != nil {
			// Even if the handler went on without its savepoint: the
			// rows written before it are not all there.
			stage.Discard(guard.stageErr)
			return stagedFailed(guard.stageErr)
		}
		if i := slices.IndexFunc(errs, func(err error) bool { return err != nil && !errors.Is(err, ErrSkipped) }); i >= 0 {
			for _, it := range run[i+1:] {
				it.ranFast = false
			}
			var be *BatchError
			if !errors.As(errs[i], &be) {
				return failed(run[i], errs[i])
			}
			// A statement for the whole batch failed (its locks, or its
			// staged rows after the handlers ran): not one delivery's
			// fault. The savepoint path, where nothing is locked ahead or
			// staged, finds the culprit, if there is one.
			stage.Discard(errs[i])
			if ctx.Err() != nil {
				return errs[i]
			}
			if rerr := tx.Rollback(ctx); rerr != nil {
				return fmt.Errorf("roll back after the batch handler failed for the batch (%v): %w", errs[i], rerr)
			}
			c.log.Debug("the batch handler failed for the whole batch; applying it with a savepoint per delivery", slog.Any("error", errs[i]))
			return chargeNone()
		}
		if errs != nil || tx.Conn().PgConn().TxStatus() == 'E' {
			// Every delivery skipped, or success on an aborted
			// transaction: which delivery is at fault is not known.
			stage.Discard(txq.ErrAborted)
			return stagedFailed(fmt.Errorf("batch handler %w", txq.ErrAborted))
		}
		for _, it := range run {
			it.outcome = outcomeDone
		}
	}
	if err := stage.Flush(ctx); err != nil {
		return stagedFailed(err) // a duplicate message id, say
	}
	return nil
}

// lockConflict reports a deadlock, serialization failure or lock timeout.
func lockConflict(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40P01", "40001", "55P03":
		return true
	}
	return false
}

// transactEach applies the batch in one transaction with a savepoint per
// delivery (see apply), so a failing handler undoes only its own work.
func (c *Consumer) transactEach(ctx context.Context, items []*item) error {
	return c.inTransaction(ctx, items, func(tx pgx.Tx, wakes *txq.Wakes) error {
		for _, it := range items {
			if it.outcome != outcomePending {
				continue
			}
			if err := c.apply(ctx, tx, it, wakes); err != nil {
				return fmt.Errorf("message %q: %w", it.messageID(), err)
			}
		}
		return nil
	})
}

// inTransaction runs apply in a new transaction, records the items to park,
// commits, and then sends the wake-ups the handlers deferred. An error means
// nothing committed.
func (c *Consumer) inTransaction(ctx context.Context, items []*item, apply func(pgx.Tx, *txq.Wakes) error) error {
	tx, err := c.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	wakes := txq.NewWakes(tx)
	if c.cfg.Relay != nil {
		wakes.HandOffTo(c.cfg.Relay)
	}
	if err := apply(tx, wakes); err != nil {
		return err
	}
	if err := c.insertAllParked(ctx, tx, items); err != nil {
		return err
	}
	if err := c.clearSuspects(ctx, tx, items); err != nil {
		return err
	}
	if c.beforeCommit != nil {
		c.beforeCommit()
	}
	if err := tx.Commit(ctx); err != nil {
		return &commitError{err: err}
	}
	wakes.Notify(ctx, c.cfg.Pool, c.log)
	return nil
}

// claimAll claims ids in the inbox (inbox.ClaimAll), or reports every one
// first when the handler dedupes (Config.HandlerDedupes).
func (c *Consumer) claimAll(ctx context.Context, tx pgx.Tx, ids []string) ([]bool, error) {
	if c.cfg.HandlerDedupes {
		first := make([]bool, len(ids))
		for i := range first {
			first[i] = true
		}
		return first, nil
	}
	return inbox.ClaimAll(ctx, tx, c.cfg.Name, ids)
}
