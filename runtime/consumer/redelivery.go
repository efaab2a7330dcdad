package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/message"
)

// headerDeliveryCount is the header in which quorum queues count a
// message's earlier deliveries that were not acknowledged.
const headerDeliveryCount = "x-delivery-count"

// redeliveriesOf returns how many times raw was delivered before without
// an acknowledgement: its x-delivery-count. A queue that does not count
// (a classic queue) marks a redelivery only with the redelivered flag; the
// consumer then counts the redeliveries of each message id it sees itself
// (see redeliveryCounter).
func (c *Consumer) redeliveriesOf(raw *amqp.Delivery) int {
	n, ok, err := message.HeaderInt(raw.Headers, headerDeliveryCount)
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
	v, ok, err := message.HeaderInt(h, message.HeaderAttempt)
	if !ok || err != nil || v < 1 {
		return 1
	}
	return int(min(v, 1<<31-1))
}
