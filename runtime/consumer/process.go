package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/retry"
)

// outcome is what happens to one delivery of a batch.
type outcome int

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

// String returns the outcome's name, as tests and logs see it.
func (o outcome) String() string {
	switch o {
	case outcomeDone:
		return "done"
	case outcomeDuplicate:
		return "duplicate"
	case outcomeRetry:
		return "retry"
	case outcomePark:
		return "park"
	default:
		return "pending"
	}
}

// item is one delivery on its way through a batch.
type item struct {
	raw     *amqp.Delivery
	d       *Delivery // nil when the delivery could not be decoded
	attempt int
	outcome outcome
	err     error         // the failure being routed (outcomeRetry, outcomePark)
	class   failure.Class // err's class
	tier    time.Duration // the retry delay (outcomeRetry)
	parkID  string        // the parked copy's message id (outcomePark)

	// redeliveries is the broker's count of earlier unacknowledged
	// deliveries (x-delivery-count). suspect: at MaxRedeliveries or more,
	// handled alone with a saga_consumer_suspect row; stoppedBefore: that
	// row was already there, so the handler is not run and it is parked.
	redeliveries           int
	suspect, stoppedBefore bool
	// failedBefore, set with stoppedBefore, is the error its last handlings
	// kept failing with, when the consumer saw them fail rather than stop
	// (see interruptedSet).
	failedBefore string

	// ranFast is set when the handler ran in a fast-path attempt (see
	// consumerTelemetry.rolledBack).
	ranFast bool

	received time.Time       // when the worker took the delivery
	reason   string          // coarse failure reason for metrics; "" = by class
	ctx      context.Context // the handler's context (identity, span); nil = the batch's
	span     trace.Span      // the delivery's process span (tracing only)
	acked    bool            // acknowledged
}

// messageID returns the delivery's message id (possibly empty).
func (it *item) messageID() string { return it.raw.MessageId }

// fail routes it by the class of err: permanent failures park; the others
// retry while the policy allows, then park.
func (it *item) fail(err error, p retry.Policy) {
	it.err = err
	it.class = failure.ClassOf(err)
	if it.class != failure.ClassPermanent {
		if ttl, ok := p.TierFor(it.attempt); ok {
			it.outcome, it.tier = outcomeRetry, ttl
			return
		}
	}
	it.outcome = outcomePark
}

// parkClass is the saga_parked.class and HeaderParkClass value.
func (it *item) parkClass() string {
	if it.class == failure.ClassPermanent {
		return "permanent"
	}
	return "exhausted"
}

// decode reads the envelope, checks type and schema version, and decodes the
// body. Every failure here is permanent: the same bytes never decode later.
func (c *Consumer) decode(raw *amqp.Delivery) *item {
	it := &item{raw: raw, attempt: attemptOf(raw.Headers), redeliveries: c.redeliveriesOf(raw), received: c.now()}
	env, err := envelope.FromDelivery(raw)
	if err != nil {
		it.reason = "invalid_envelope"
		it.fail(failure.Permanent(fmt.Errorf("invalid envelope: %w", err)), c.cfg.Retry)
		return it
	}
	if !utf8.ValidString(env.MessageID) || strings.ContainsRune(env.MessageID, 0) {
		// The inbox could never store it: every claim would fail.
		it.reason = "invalid_envelope"
		it.fail(failure.Permanent(fmt.Errorf("invalid envelope: message id %q is not valid UTF-8 text", env.MessageID)), c.cfg.Retry)
		return it
	}
	info, ok := c.cfg.Registry.Lookup(env.MessageType)
	if !ok {
		it.reason = "unknown_type"
		it.fail(failure.Permanent(fmt.Errorf("unknown message type %q", env.MessageType)), c.cfg.Retry)
		return it
	}
	if env.SchemaVersion > info.SchemaVersion {
		it.reason = "schema_mismatch"
		it.fail(failure.Permanent(fmt.Errorf("schema version mismatch: %s version %d is newer than this consumer's version %d",
			env.MessageType, env.SchemaVersion, info.SchemaVersion)), c.cfg.Retry)
		return it
	}
	msg, err := c.cfg.Registry.Decode(env.MessageType, env.Body)
	if err != nil {
		it.reason = "undecodable"
		it.fail(failure.Permanent(fmt.Errorf("undecodable body: %w", err)), c.cfg.Retry)
		return it
	}
	it.d = &Delivery{Envelope: env, Message: msg, Queue: c.cfg.Queue, Attempt: it.attempt, ReceivedAt: it.received}
	return it
}

// headerDeliveryCount is the header in which quorum queues count a
// message's earlier deliveries that were not acknowledged.
const headerDeliveryCount = "x-delivery-count"

// redeliveriesOf returns how many times raw was delivered before without
// an acknowledgement: its x-delivery-count. A queue that does not count
// (a classic queue) marks a redelivery only with the redelivered flag; the
// consumer then counts the redeliveries of each message id it sees itself
// (see redeliveryCounter).
func (c *Consumer) redeliveriesOf(raw *amqp.Delivery) int {
	n, ok, err := envelope.HeaderInt(raw.Headers, headerDeliveryCount)
	switch {
	case ok && (err != nil || n < 0):
		return 0
	case ok:
		return int(min(n, 1<<31-1))
	case raw.Redelivered && raw.MessageId != "":
		return c.redelivered.count(raw.MessageId)
	}
	return 0
}

// redeliveryCounter counts, per message id, the redeliveries this process
// has seen of messages whose queue does not count them, so that the
// redelivery guard (Config.MaxRedeliveries) also bounds a message whose
// handling ends the session every time on a classic queue. It is memory
// only: a process that dies forgets its counts (a message that crashes the
// process is not caught this way), and an id is forgotten once its delivery
// is acknowledged. Past maxInterrupted ids it starts over, which costs only
// redeliveries before the guard acts.
type redeliveryCounter struct {
	mu sync.Mutex
	n  map[string]int
}

// count records one more redelivery of id and returns how many there were.
func (r *redeliveryCounter) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil || len(r.n) >= maxInterrupted {
		r.n = map[string]int{}
	}
	r.n[id]++
	return r.n[id]
}

// forget drops the counts of the settled items.
func (r *redeliveryCounter) forget(items []*item) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.n) == 0 {
		return
	}
	for _, it := range items {
		delete(r.n, it.messageID())
	}
}

// overLimit reports a decoded delivery the broker has delivered
// MaxRedeliveries times or more without an acknowledgement (see
// Config.MaxRedeliveries).
func (c *Consumer) overLimit(it *item) bool {
	return c.cfg.MaxRedeliveries >= 0 && it.d != nil && it.outcome == outcomePending &&
		it.redeliveries >= c.cfg.MaxRedeliveries
}

// markSuspect commits a saga_consumer_suspect row for it, which is about to
// be handled alone; the row is deleted in the transaction that handles it.
// A row already there means an earlier delivery's handling never finished:
// it stopped the consumer.
func (c *Consumer) markSuspect(ctx context.Context, it *item) error {
	tag, err := c.cfg.Pool.Exec(ctx, `INSERT INTO saga_consumer_suspect (consumer, message_id, redeliveries)
VALUES ($1, $2, $3) ON CONFLICT (consumer, message_id) DO NOTHING`, c.cfg.Name, it.messageID(), it.redeliveries)
	if err != nil {
		return fmt.Errorf("message %q, redelivered %d times: record it before handling it alone: %w", it.messageID(), it.redeliveries, err)
	}
	it.suspect = true
	it.stoppedBefore = tag.RowsAffected() == 0 && !c.interrupted.take(it.messageID())
	if it.stoppedBefore {
		it.failedBefore = c.interrupted.failure(it.messageID())
	}
	if it.stoppedBefore && it.failedBefore == "" {
		c.log.WarnContext(it.handlerContext(ctx), "message redelivered without an acknowledgement after its handling stopped the consumer; parking it",
			slog.String("message_id", it.messageID()), slog.Int("redeliveries", it.redeliveries))
	}
	return nil
}

// interruptedSet remembers the messages handled alone whose handling this
// process saw end with an error (the database went away mid-transaction,
// say) rather than stop the consumer: their saga_consumer_suspect row
// stays, and without this memory their next delivery would be parked as if
// they had stopped it. A process that dies forgets them, as it should.
type interruptedSet struct {
	mu  sync.Mutex
	ids map[string]struct{}
	// spared counts, per message, the handlings spared so far; failed
	// holds the error of a message spared maxSpared times that failed
	// again, for its park reason.
	spared map[string]int
	failed map[string]string
}

// maxInterrupted bounds the set; past it the set starts over (an entry lost
// costs only a park that the guard would have made before this set existed).
const maxInterrupted = 4096

// maxSpared is how many times one message's failed suspect handling is
// spared: a failure that comes back every time (a database error its own
// content causes at commit, such as running out of lock memory) must end in
// the parking lot, not in an endless loop of redeliveries.
const maxSpared = 2

// clearTimeout bounds the attempt to clear a spared handling's record at
// once, before its session ends.
const clearTimeout = 2 * time.Second

// add remembers id, whose handling failed with err, unless it was spared
// maxSpared times already; it reports whether it did. (The set starts over
// past maxInterrupted messages, counts included: a message may then be
// spared again, which costs redeliveries, never a false park.)
func (s *interruptedSet) add(id string, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil || len(s.spared)+len(s.failed) >= maxInterrupted {
		s.ids, s.spared, s.failed = map[string]struct{}{}, map[string]int{}, map[string]string{}
	}
	if s.spared[id] >= maxSpared {
		s.failed[id] = err.Error()
		return false
	}
	s.spared[id]++
	s.ids[id] = struct{}{}
	return true
}

// failure returns the error id kept failing with once it was spared
// maxSpared times, or "".
func (s *interruptedSet) failure(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed[id]
}

// all returns the ids in the set.
func (s *interruptedSet) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.ids))
}

// forget removes ids from the set.
func (s *interruptedSet) forget(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.ids, id)
	}
}

// clearInterrupted deletes the saga_consumer_suspect rows of the
// interrupted set once the database answers again (at the start of a
// session), so that a redelivery to another process, which cannot know
// this one saw the handling fail, is not parked for them either. A row that
// cannot be deleted now stays in the set for this process.
func (c *Consumer) clearInterrupted(ctx context.Context) {
	ids := c.interrupted.all()
	if len(ids) == 0 {
		return
	}
	if _, err := c.cfg.Pool.Exec(ctx, `DELETE FROM saga_consumer_suspect WHERE consumer = $1 AND message_id = ANY($2)`, c.cfg.Name, ids); err != nil {
		c.log.Warn("could not clear the suspect records of handlings that ended with an error; this process still spares them",
			slog.Any("message_ids", ids), slog.Any("error", err))
		return
	}
	c.interrupted.forget(ids)
}

// take reports whether id is in the set and removes it.
func (s *interruptedSet) take(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	delete(s.ids, id)
	return ok
}

// clearSuspectsAlone deletes the saga_consumer_suspect rows of items that
// need no transaction of their own (routed to retry after a rejected
// commit): nothing else would delete them.
func (c *Consumer) clearSuspectsAlone(ctx context.Context, items []*item) error {
	if !slices.ContainsFunc(items, func(it *item) bool { return it.suspect }) {
		return nil
	}
	return pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error { return c.clearSuspects(ctx, tx, items) })
}

// clearSuspects deletes, in tx, the saga_consumer_suspect rows of the items
// handled alone (whatever their outcome: tx commits it).
func (c *Consumer) clearSuspects(ctx context.Context, tx pgx.Tx, items []*item) error {
	var ids []string
	for _, it := range items {
		if it.suspect {
			ids = append(ids, it.messageID())
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM saga_consumer_suspect WHERE consumer = $1 AND message_id = ANY($2)`, c.cfg.Name, ids); err != nil {
		return fmt.Errorf("clear the suspect record of %v: %w", ids, err)
	}
	return nil
}

// attemptOf reads HeaderAttempt; absent or malformed means the first.
func attemptOf(h amqp.Table) int {
	v, ok, err := envelope.HeaderInt(h, envelope.HeaderAttempt)
	if !ok || err != nil || v < 1 {
		return 1
	}
	return int(min(v, 1<<31-1))
}

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
		items[0].fail(failure.Permanent(fault.err), c.cfg.Retry)
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
// every pending delivery in the inbox, then the handlers run directly in the
// batch's transaction, each one's queued writes sent as one pipeline when it
// returns (see runtime/internal/txq). This saves three round trips per
// delivery (SAVEPOINT, the claim, RELEASE) when every handler succeeds,
// which is the common case. The saga instance updates and the outbox and
// audit rows of every handler are staged (txq.Stage) and written by one
// statement per kind before the commit; if that fails, nothing tells which
// handler's row was at fault, so no attempt is charged and the batch goes
// down the savepoint path, where nothing is staged.
//
// The first handler that fails ends the attempt: the transaction rolls back,
// that delivery keeps its failure (it is not run again), the deliveries
// handled before it become pending again, and errFallBack tells transact to
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
	first, err := inbox.ClaimAll(ctx, tx, c.cfg.Name, ids)
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
	batch := make([]*Delivery, 0, len(pending))
	for i, it := range pending {
		if first[i] {
			batch = append(batch, it.d)
		}
	}
	for i, it := range pending {
		if !first[i] {
			it.outcome = outcomeDuplicate
			c.log.Debug("duplicate message acknowledged without effect", slog.String("message_id", it.messageID()))
			continue
		}
		hctx := WithBatch(stage.Attach(it.handlerContext(ctx)), batch)
		it.ranFast = true
		herr := c.runHandler(hctx, guard, wakes, it)
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
		if herr == nil {
			it.outcome = outcomeDone
			continue
		}
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
		var batchFault *BatchFaultError
		if lockConflict(herr) || errors.As(herr, &batchFault) {
			// The batch's inbox claims hold locks from its first
			// statement, so a deadlock or serialization failure here may
			// be the batch's doing rather than this delivery's, as is a
			// failure of work a handler did for the whole batch: charge
			// no attempt, the savepoint path applies it again.
			return chargeNone()
		}
		for _, p := range pending[:i] {
			p.outcome = outcomePending
		}
		it.fail(fmt.Errorf("handler: %w", herr), c.cfg.Retry)
		return errFallBack
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
	c.sendWakes(ctx, wakes)
	return nil
}

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

// sendWakes sends, after a commit, the notifications the handlers deferred
// (the outbox relays' wake-up). A failure costs only latency: relays poll.
func (c *Consumer) sendWakes(ctx context.Context, wakes *txq.Wakes) {
	if err := wakes.Send(ctx, c.cfg.Pool); err != nil {
		c.log.Warn("wake-up after commit failed; relays will find the messages by polling", slog.Any("error", err))
	}
}

// runHandler runs the handler of it on tx with a write scope, sends the
// writes it queued, and checks it left the transaction usable. The
// handler's after-commit work (the outbox's hand-off to a local relay) goes
// to wakes only when it succeeded: its writes then commit with the batch's
// transaction, or not at all (a failure after this point fails the whole
// transaction, and the wake set is dropped with it).
func (c *Consumer) runHandler(ctx context.Context, tx pgx.Tx, wakes *txq.Wakes, it *item) error {
	if it.stoppedBefore && it.failedBefore != "" {
		it.reason = "redelivered"
		return failure.Permanent(fmt.Errorf("redelivered %d times without an acknowledgement (MaxRedeliveries %d), "+
			"and handling it alone failed %d times in a row with a database error that ends the session: %s: not run again",
			it.redeliveries, c.cfg.MaxRedeliveries, maxSpared+1, it.failedBefore))
	}
	if it.stoppedBefore {
		// Not a duplicate (its inbox claim was the first), and its last
		// handling never finished: do not risk it again.
		it.reason = "redelivered"
		return failure.Permanent(fmt.Errorf("redelivered %d times without an acknowledgement (MaxRedeliveries %d), "+
			"and handling it alone stopped the consumer before: not run again", it.redeliveries, c.cfg.MaxRedeliveries))
	}
	err := txq.Run(wakes.Attach(ctx), tx, wakes, func(ctx context.Context, tx pgx.Tx) error {
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
	herr := c.runHandler(it.handlerContext(ctx), sp, wakes, it)
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

// finish routes failed items to their tier or the parking lot and
// acknowledges every item that is settled. An item whose publish failed is
// not acknowledged; the error makes the session end so it is redelivered.
func (s *session) finish(ctx context.Context, items []*item) error {
	c := s.c
	var tags []uint64
	var settled []*item
	var routed []*item
	var out []broker.Outgoing
	for _, it := range items {
		switch it.outcome {
		case outcomeDone, outcomeDuplicate:
			tags = append(tags, it.raw.DeliveryTag)
			settled = append(settled, it)
		case outcomeRetry:
			routed = append(routed, it)
			out = append(out, broker.Outgoing{RoutingKey: broker.TierQueue(c.cfg.Queue, it.tier), Publishing: c.retryPublishing(it)})
		case outcomePark:
			routed = append(routed, it)
			out = append(out, broker.Outgoing{RoutingKey: broker.ParkingQueue(c.cfg.Queue), Publishing: c.parkPublishing(it)})
		}
	}
	var routeErr error
	if len(out) > 0 {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		errs := c.pub.Publish(pctx, out)
		cancel()
		for i, it := range routed {
			if errs[i] != nil {
				routeErr = errors.Join(routeErr, fmt.Errorf("message %q: publish to %q: %w", it.messageID(), out[i].RoutingKey, errs[i]))
				continue
			}
			tags = append(tags, it.raw.DeliveryTag)
			settled = append(settled, it)
			// The handler's context: a telemetry.NewLogHandler adds the
			// delivery's saga, correlation and causation ids.
			lctx := it.handlerContext(ctx)
			if it.outcome == outcomeRetry {
				c.log.WarnContext(lctx, "message failed; retrying after a delay",
					slog.String("message_id", it.messageID()), slog.Int("attempt", it.attempt),
					slog.String("class", it.class.String()), slog.String("delay", it.tier.String()), slog.Any("error", it.err))
			} else {
				c.log.ErrorContext(lctx, "message parked",
					slog.String("message_id", it.messageID()), slog.Int("attempt", it.attempt),
					slog.String("class", it.parkClass()), slog.Any("error", it.err))
			}
		}
	}
	if err := s.acker.ack(tags); err != nil {
		// The channel is gone: the session ends through its close
		// notification and the deliveries come back; the inbox makes
		// their second handling a no-op.
		c.log.Warn("acknowledgement failed; deliveries will be redelivered", slog.Any("error", err))
	} else if len(tags) > 0 {
		s.progress.Store(true)
		c.redelivered.forget(settled)
		c.tel.settled(ctx, settled, c.now())
		if c.onSettle != nil {
			for _, it := range settled {
				c.onSettle(it.messageID(), it.outcome.String())
			}
		}
	}
	if routeErr != nil {
		return &routeError{routeErr}
	}
	return nil
}

// routeError: retry or parked copies could not be published, so their
// deliveries were not acknowledged (see restartsAfresh).
type routeError struct{ err error }

func (e *routeError) Error() string { return "route failed deliveries: " + e.err.Error() }
func (e *routeError) Unwrap() error { return e.err }
