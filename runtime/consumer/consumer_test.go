package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
)

// noteInfo is the test message's type: a sagatest.Message whose text tells
// the handler what to do, with no idempotency key and "key-TEXT" as its
// correlation field.
var noteInfo = sagatest.Type{
	FullName:       "sagatest.v1.Note",
	Kind:           message.KindEvent,
	Exchange:       "events",
	RoutingKey:     "note.created",
	SchemaVersion:  2,
	IdempotencyKey: func(string) string { return "" },
	CorrelationKey: func(text string) string { return "key-" + text },
}.Info()

// Handler behaviours, chosen by the note's text.
const (
	doOK            = "ok"
	doPermanent     = "permanent"      // effect, then a permanent error
	doTransientOnce = "transient-once" // effect, then a transient error on attempt 1
	doTransient     = "transient"      // effect, then always a transient error
	doEarly         = "early"          // effect, then an early (expected, transient) error on attempt 1
	doPanic         = "panic"          // effect, then panic
	doDeferred      = "deferred"       // violates a deferred unique constraint: fails at commit
	doBlock         = "block"          // waits for release on its first call
	doSwallow       = "swallow"        // ignores a failed statement and returns nil
	doCloseTx       = "close-tx"       // commits the savepoint it was given
	doEnqueue       = "enqueue"        // writes an outbox row (outbox.Enqueue)
	doEnqueueFail   = "enqueue-fail"   // writes an outbox row, then a permanent error
	doEnqueueHold   = "enqueue-hold"   // writes an outbox row, then waits for release on its first call
	doEnqueueShared = "enqueue-shared" // writes the outbox row "shared-out", whoever calls
	doSavepointRead = "savepoint-read" // counts, in a savepoint of its own, the outbox rows it can see
	doBatchFault    = "batch-fault"    // fails its batch as a whole on the fast path (lockingBatch); its handler succeeds
	doStopConsumer  = "stop-consumer"  // stops the running consumer and waits to be interrupted, as a crash would
)

// copyKey routes the messages handlers write to the outbox; the notes
// queue does not take them.
const copyKey = "copy.note"

const (
	testTimeout = 30 * time.Second
	poll        = 10 * time.Millisecond
)

type call struct {
	attempt int
	headers map[string]any
}

type settlement struct{ id, outcome string }

type testBundle struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	amqpURL string
	conn    *broker.Conn // the consumers' connection
	pubConn *broker.Conn // the consumers' publishing connection
	testPub *broker.Publisher
	queue   string
	policy  retry.Policy
	relay   *outbox.Relay // the consumers' relay (Config.Relay), if any
	reg     *message.Registry

	entered chan string   // a doBlock handler started waiting
	release chan struct{} // closed to let doBlock handlers continue

	mu      sync.Mutex
	stopRun func() // cancels the running consumer (doStopConsumer)
	calls   map[string][]call
	locked  map[string][][]string // by message id: the batches lockingBatch locked with it
	seen    map[string]int        // doSavepointRead: outbox rows seen, by message id
	settled []settlement
	batches [][]string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, `
CREATE TABLE effects (message_id text NOT NULL, attempt int NOT NULL);
CREATE TABLE uniq (k text UNIQUE DEFERRABLE INITIALLY DEFERRED);
INSERT INTO uniq VALUES ('taken');`)
	require.NoError(t, err)

	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	reg, err := message.NewRegistry(noteInfo)
	require.NoError(t, err)
	b := &testBundle{
		t:       t,
		ctx:     ctx,
		pool:    pool,
		amqpURL: amqpURL,
		conn:    dial("consumer"),
		pubConn: dial("publisher"),
		queue:   "notes",
		policy:  retry.Policy{Tiers: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, MaxAttempts: 3},
		reg:     reg,
		entered: make(chan string, 16),
		release: make(chan struct{}),
		calls:   map[string][]call{},
		locked:  map[string][][]string{},
		seen:    map[string]int{},
	}
	b.testPub = broker.NewPublisher(b.pubConn, broker.PublisherConfig{})
	t.Cleanup(func() { _ = b.testPub.Close() })

	ch, err := b.conn.Channel(ctx)
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: "events"}},
		Queues:    broker.WorkQueue(b.queue, broker.QueueQuorum, b.policy),
		Bindings:  []broker.Binding{{Queue: b.queue, Exchange: "events", RoutingKey: "note.#"}},
	}))
	return b
}

// handle is the test handler: it records the call, writes an effect row in
// tx, then behaves as the note's text says.
func (b *testBundle) handle(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
	id := d.Envelope.MessageID
	b.mu.Lock()
	b.calls[id] = append(b.calls[id], call{attempt: d.Attempt, headers: d.Envelope.Headers})
	first := len(b.calls[id]) == 1
	b.mu.Unlock()
	if d.Queue != b.queue {
		return retry.Permanent(errors.New("wrong queue in delivery"))
	}
	text := d.Message.(*sagatest.Message).GetValue()
	if text == doBlock && first {
		b.entered <- id
		<-b.release
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, attempt) VALUES ($1, $2)`, id, d.Attempt); err != nil {
		return err
	}
	switch text {
	case doPermanent:
		return retry.Permanent(errors.New("order rejected"))
	case doTransientOnce:
		if d.Attempt == 1 {
			return retry.Transient(errors.New("flaky dependency"))
		}
	case doTransient:
		return retry.Transient(errors.New("flaky dependency"))
	case doEarly:
		if d.Attempt == 1 {
			return retry.Early(errors.New("step not reached yet"))
		}
	case doPanic:
		panic("boom")
	case doSwallow:
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
	case doCloseTx:
		return tx.Commit(ctx)
	case doEnqueue, doEnqueueFail, doEnqueueHold, doEnqueueShared:
		out := id + "-out"
		if text == doEnqueueShared {
			out = "shared-out"
		}
		if err := outbox.Enqueue(ctx, tx, message.Envelope{MessageID: out, MessageType: noteInfo.FullName,
			SchemaVersion: 1, Exchange: "events", RoutingKey: copyKey}); err != nil {
			return err
		}
		switch {
		case text == doEnqueueFail:
			return retry.Permanent(errors.New("rejected after writing to the outbox"))
		case text == doEnqueueHold && first:
			b.entered <- id
			<-b.release
		}
	case doDeferred:
		if _, err := tx.Exec(ctx, `INSERT INTO uniq VALUES ('taken')`); err != nil {
			return err
		}
	case doSavepointRead:
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		var n int
		if err := sp.QueryRow(ctx, `SELECT count(*) FROM saga_outbox`).Scan(&n); err != nil {
			return err
		}
		b.mu.Lock()
		b.seen[id] = n
		b.mu.Unlock()
		return sp.Commit(ctx)
	case doStopConsumer:
		b.mu.Lock()
		stop := b.stopRun
		b.mu.Unlock()
		stop()
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

type running struct {
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

// start runs a consumer; edit adjusts its config. It is stopped at cleanup.
func (b *testBundle) start(edit func(*consumer.Config), hook func(ids []string) error) *running {
	b.t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("SAGA_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg := consumer.Config{
		Name:        "notes-consumer",
		Queue:       b.queue,
		Pool:        b.pool,
		Conn:        b.conn,
		PublishConn: b.pubConn,
		Registry:    b.reg,
		Handler:     b.handle,
		Relay:       b.relay,
		Concurrency: 2,
		BatchSize:   4,
		Retry:       b.policy,
		Logger:      logger,
	}
	if edit != nil {
		edit(&cfg)
	}
	// The handler runs under the test's batch handler, which locks its
	// batches ahead as the saga engine and the participant glue do.
	cfg.Batch, cfg.Handler = lockingBatch{b, cfg.Handler}, nil
	c, err := consumer.New(cfg)
	require.NoError(b.t, err)
	consumer.SetOnSettle(c, func(id, outcome string) {
		b.mu.Lock()
		b.settled = append(b.settled, settlement{id, outcome})
		b.mu.Unlock()
	})
	consumer.SetAfterCommit(c, func(ids []string) error {
		b.mu.Lock()
		b.batches = append(b.batches, ids)
		b.mu.Unlock()
		if hook != nil {
			return hook(ids)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(b.ctx)
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	b.mu.Lock()
	b.stopRun = cancel
	b.mu.Unlock()
	go func() { r.done <- c.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(testTimeout):
			b.t.Errorf("consumer did not stop")
		}
	})
	return r
}

// stop cancels the consumer and waits for Run, which must return nil.
func (b *testBundle) stop(r *running) {
	b.t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(b.t, err)
	case <-time.After(testTimeout):
		b.t.Fatal("consumer did not stop")
	}
	r.done <- nil // for the cleanup
}

// sendOneBatch makes notes (id, text) one batch of r, a consumer with
// Concurrency 1: a gate message holds the only worker while they queue up
// behind it, and is let go once all of them are buffered.
func (b *testBundle) sendOneBatch(r *running, notes ...[2]string) {
	b.t.Helper()
	b.send("gate", doBlock, nil)
	require.Equal(b.t, "gate", <-b.entered)
	for _, n := range notes {
		b.send(n[0], n[1], nil)
	}
	require.Eventually(b.t, func() bool { return consumer.Buffered(r.c) == len(notes) }, testTimeout, poll)
	close(b.release)
}

// envelopeFor builds the envelope of a note.
func (b *testBundle) envelopeFor(id, text string) message.Envelope {
	b.t.Helper()
	env, err := message.New(sagatest.NewMessage(noteInfo, text), message.Meta{MessageID: id, SagaID: "saga-" + id})
	require.NoError(b.t, err)
	return env
}

// send publishes a note through the "events" exchange; edit may change the
// publishing first.
func (b *testBundle) send(id, text string, edit func(*amqp.Publishing)) {
	b.t.Helper()
	env := b.envelopeFor(id, text)
	p := env.Publishing()
	if edit != nil {
		edit(&p)
	}
	b.publish(broker.Outgoing{Exchange: "events", RoutingKey: "note.created", Publishing: p})
}

// publish publishes raw messages, retrying while the connection recovers.
func (b *testBundle) publish(msgs ...broker.Outgoing) {
	b.t.Helper()
	for i, m := range msgs {
		if m.Publishing.MessageId == "" {
			// The test publisher needs an id to match returns; publish such a
			// message on a plain confirmed channel instead.
			ch, err := b.pubConn.Channel(b.ctx)
			require.NoError(b.t, err)
			require.NoError(b.t, ch.Confirm(false))
			dc, err := ch.PublishWithDeferredConfirmWithContext(b.ctx, m.Exchange, m.RoutingKey, true, false, m.Publishing)
			require.NoError(b.t, err)
			require.True(b.t, dc.Wait())
			require.NoError(b.t, ch.Close())
			continue
		}
		require.Eventually(b.t, func() bool {
			return b.testPub.Publish(b.ctx, msgs[i:i+1])[0] == nil
		}, testTimeout, poll, "publish %s", m.Publishing.MessageId)
	}
}

// ready returns the number of ready messages in queue.
func (b *testBundle) ready(queue string) int {
	b.t.Helper()
	ch, err := b.pubConn.Channel(b.ctx)
	require.NoError(b.t, err)
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(b.t, err)
	return q.Messages
}

// drain takes every message out of queue.
func (b *testBundle) drain(queue string) []amqp.Delivery {
	b.t.Helper()
	ch, err := b.pubConn.Channel(b.ctx)
	require.NoError(b.t, err)
	defer func() { _ = ch.Close() }()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(b.t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// waitSettled waits until id was acknowledged with outcome.
func (b *testBundle) waitSettled(id, outcome string) {
	b.t.Helper()
	b.waitSettledAs(id, outcome)
}

// waitSettledAs waits until a delivery of message id was acknowledged with
// one of the outcomes.
func (b *testBundle) waitSettledAs(id string, outcomes ...string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, o := range outcomes {
			if slices.Contains(b.settled, settlement{id, o}) {
				return true
			}
		}
		return false
	}, testTimeout, poll, "message %s never settled as %s", id, strings.Join(outcomes, " or "))
}

// settledCount returns how many deliveries were acknowledged.
func (b *testBundle) settledCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.settled)
}

// lockingBatch is the test's batch handler: like the saga engine's and the
// participant glue's, it locks ahead only a batch of two or more (the
// consumer's savepoint path hands it one delivery at a time), recording
// the batch for each of its messages, and fails the whole batch when one
// of them says doBatchFault; then it runs h for each delivery.
type lockingBatch struct {
	b *testBundle
	h consumer.HandlerFunc
}

func (l lockingBatch) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
	if len(ds) < 2 {
		return l.h.HandleBatch(ctx, tx, ds)
	}
	b := l.b
	ids := make([]string, len(ds))
	fault := false
	for i, d := range ds {
		ids[i] = d.Envelope.MessageID
		fault = fault || d.Message.(*sagatest.Message).GetValue() == doBatchFault
	}
	b.mu.Lock()
	for _, id := range ids {
		b.locked[id] = append(b.locked[id], ids)
	}
	b.mu.Unlock()
	if fault {
		return consumer.FailBatch(ds, errors.New("a statement for the whole batch failed"))
	}
	return l.h.HandleBatch(ctx, tx, ds)
}

// locksOf returns the batches lockingBatch locked with message id.
func (b *testBundle) locksOf(id string) [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.locked[id])
}

func (b *testBundle) callsOf(id string) []call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls[id])
}

func (b *testBundle) attemptsOf(id string) []int {
	var out []int
	for _, c := range b.callsOf(id) {
		out = append(out, c.attempt)
	}
	return out
}

// effects returns the committed effect rows of id (their attempts).
func (b *testBundle) effects(id string) []int {
	b.t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT attempt FROM effects WHERE message_id = $1 ORDER BY attempt`, id)
	require.NoError(b.t, err)
	attempts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(b.t, err)
	return attempts
}

type parkedRow struct {
	MessageID, Queue, MessageType, SagaID, CorrelationID, Class, Reason, Exchange, RoutingKey string
	Attempts                                                                                  int
	Body                                                                                      []byte
	Headers                                                                                   map[string]any
}

func (b *testBundle) parked() map[string]parkedRow {
	b.t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT message_id, queue, message_type, saga_id, correlation_id, class, reason,
		exchange, routing_key, attempts, body, headers FROM saga_parked ORDER BY id`)
	require.NoError(b.t, err)
	defer rows.Close() // a failed require inside the loop must not hold the connection the test's cleanup waits for
	out := map[string]parkedRow{}
	for rows.Next() {
		var r parkedRow
		require.NoError(b.t, rows.Scan(&r.MessageID, &r.Queue, &r.MessageType, &r.SagaID, &r.CorrelationID, &r.Class,
			&r.Reason, &r.Exchange, &r.RoutingKey, &r.Attempts, &r.Body, &r.Headers))
		_, dup := out[r.MessageID]
		require.False(b.t, dup, "message %q parked twice", r.MessageID)
		out[r.MessageID] = r
	}
	require.NoError(b.t, rows.Err())
	return out
}

func header(t *testing.T, h amqp.Table, key string) string {
	t.Helper()
	s, ok, err := message.HeaderString(h, key)
	require.NoError(t, err)
	require.True(t, ok, "header %s missing in %v", key, h)
	return s
}

func TestConsumer(t *testing.T) {
	t.Parallel()

	t.Run("HandlesEachMessageOnceAndAcksAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		ids := make([]string, 40)
		for i := range ids {
			ids[i] = "m" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			b.send(ids[i], doOK, nil)
		}
		for _, id := range ids {
			b.waitSettled(id, "done")
		}
		b.stop(r)
		for _, id := range ids {
			require.Equal(t, []int{1}, b.effects(id), "message %s", id)
			require.Equal(t, []int{1}, b.attemptsOf(id))
		}
		fast, fellBack := consumer.Paths(r.c)
		require.Positive(t, fast, "successful batches commit on the fast path")
		require.Zero(t, fellBack, "no handler failed, so nothing falls back to savepoints")
		require.Zero(t, b.ready(b.queue))
		require.Empty(t, b.parked())
	})

	t.Run("WakesRelaysAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		listener, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer listener.Release()
		_, err = listener.Exec(b.ctx, `LISTEN `+outbox.NotifyChannel)
		require.NoError(t, err)
		r := b.start(nil, nil)
		b.send("enq", doEnqueue, nil)
		b.waitSettled("enq", "done")
		wctx, cancel := context.WithTimeout(b.ctx, testTimeout)
		defer cancel()
		_, err = listener.Conn().WaitForNotification(wctx)
		require.NoError(t, err, "a batch that wrote outbox rows notifies relays once it committed")
		b.stop(r)
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM saga_outbox WHERE message_id = 'enq-out'`).Scan(&n))
		require.Equal(t, 1, n)
	})

	t.Run("CrashAfterCommitBeforeAck", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		crash := errors.New("killed after commit")
		r := b.start(func(c *consumer.Config) { c.BatchSize = 1; c.Concurrency = 1 },
			func([]string) error { return crash })
		b.send("m1", doOK, nil)
		select {
		case err := <-r.done:
			require.ErrorIs(t, err, crash)
			r.done <- nil
		case <-time.After(testTimeout):
			t.Fatal("consumer did not crash")
		}
		// The effect committed, but the message was not acknowledged: the
		// broker has it again.
		require.Equal(t, []int{1}, b.effects("m1"))
		require.Eventually(t, func() bool { return b.ready(b.queue) == 1 }, testTimeout, poll)

		// A fresh consumer gets the redelivery; the inbox recognizes it.
		r2 := b.start(nil, nil)
		b.waitSettled("m1", "duplicate")
		b.stop(r2)
		require.Len(t, b.callsOf("m1"), 1, "handler must not run for the redelivery")
		require.Equal(t, []int{1}, b.effects("m1"))
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("DuplicateMessageIDHandledOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		b.send("dup", doOK, nil)
		b.send("dup", doOK, nil)
		b.waitSettled("dup", "done")
		b.waitSettled("dup", "duplicate")
		b.stop(r)
		require.Len(t, b.callsOf("dup"), 1)
		require.Equal(t, []int{1}, b.effects("dup"))
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("HandlerDedupesClaimsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var mu sync.Mutex
		var unclaimed []string
		r := b.start(func(cfg *consumer.Config) {
			cfg.HandlerDedupes = true
			next := cfg.Handler
			cfg.Handler = func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
				mu.Lock()
				unclaimed = append(unclaimed, d.Unclaimed)
				mu.Unlock()
				return next(ctx, tx, d)
			}
		}, nil)
		b.send("hd", doOK, nil)
		b.waitSettled("hd", "done")
		b.stop(r)
		var claims int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM saga_inbox`).Scan(&claims))
		require.Zero(t, claims, "the handler dedupes: no inbox claim")
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"notes-consumer"}, unclaimed, "the delivery names the consumer that claimed nothing")
	})

	t.Run("TransientFailureRetriesThroughTier", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		b.send("t1", doTransientOnce, nil)
		b.waitSettled("t1", "retry")
		b.waitSettled("t1", "done")
		b.stop(r)

		calls := b.callsOf("t1")
		require.Len(t, calls, 2)
		require.Equal(t, 1, calls[0].attempt)
		require.Equal(t, 2, calls[1].attempt)
		second := amqp.Table(calls[1].headers)
		require.Contains(t, header(t, second, consumer.HeaderLastError), "flaky dependency")
		require.Equal(t, "events", header(t, second, message.HeaderOrigExchange))
		require.Equal(t, "note.created", header(t, second, message.HeaderOrigRoutingKey))
		_, ok, err := message.HeaderTime(second, message.HeaderFirstFailureAt)
		require.NoError(t, err)
		require.True(t, ok)
		// The copy waited in the first tier queue and expired back.
		deaths, ok := second["x-death"].([]any)
		require.True(t, ok, "x-death header missing: %v", second)
		var expiredFrom []string
		for _, d := range deaths {
			if dt, ok := d.(amqp.Table); ok && dt["reason"] == "expired" {
				expiredFrom = append(expiredFrom, dt["queue"].(string))
			}
		}
		require.Equal(t, []string{broker.TierQueue(b.queue, 100*time.Millisecond)}, expiredFrom)
		// The failed attempt's effect was rolled back; the second committed.
		require.Equal(t, []int{2}, b.effects("t1"))
		require.Empty(t, b.parked())
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("AlwaysTransientIsParkedAfterMaxAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		b.send("t2", doTransient, nil)
		b.waitSettled("t2", "park")
		b.send("after", doOK, nil)
		b.waitSettled("after", "done")
		b.stop(r)

		require.Equal(t, []int{1, 2, 3}, b.attemptsOf("t2"))
		require.Empty(t, b.effects("t2"))
		row := b.parked()["t2"]
		require.Equal(t, "exhausted", row.Class)
		require.Equal(t, 3, row.Attempts)
		require.Contains(t, row.Reason, "flaky dependency")
		require.Equal(t, b.queue, row.Queue)
		require.Equal(t, "events", row.Exchange)
		require.Equal(t, "note.created", row.RoutingKey)
		require.Equal(t, "saga-t2", row.SagaID)
		require.Equal(t, noteInfo.FullName, row.MessageType)
		require.Equal(t, b.envelopeFor("t2", doTransient).Body, row.Body)

		parked := b.drain(broker.ParkingQueue(b.queue))
		require.Len(t, parked, 1)
		p := parked[0]
		require.Equal(t, "t2", p.MessageId)
		require.Equal(t, "exhausted", header(t, p.Headers, message.HeaderParkClass))
		require.Contains(t, header(t, p.Headers, message.HeaderParkReason), "flaky dependency")
		require.Equal(t, b.queue, header(t, p.Headers, message.HeaderOrigQueue))
		require.Equal(t, "events", header(t, p.Headers, message.HeaderOrigExchange))
		require.Equal(t, "note.created", header(t, p.Headers, message.HeaderOrigRoutingKey))
		attempt, _, err := message.HeaderInt(p.Headers, message.HeaderAttempt)
		require.NoError(t, err)
		require.EqualValues(t, 3, attempt)
		// The parked copy is still a valid envelope: it can be replayed.
		env, err := message.FromDelivery(&p)
		require.NoError(t, err)
		require.Equal(t, "saga-t2", env.SagaID)
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("PermanentFailuresAreParkedAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)

		b.send("perm", doPermanent, nil)
		b.send("undecodable", doOK, func(p *amqp.Publishing) { p.Body = []byte{0x0a, 0x05, 'a'} })
		b.send("unknown-type", doOK, func(p *amqp.Publishing) { p.Type = "sagatest.v1.Nope" })
		b.send("newer-schema", doOK, func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = int32(3) })
		b.send("older-schema", doOK, func(p *amqp.Publishing) { p.Headers[message.HeaderSchemaVersion] = int32(1) })
		// Hostile metadata: a message id and header PostgreSQL text cannot hold.
		hostile := "bad\x00id\xff"
		b.send(hostile, doOK, func(p *amqp.Publishing) {
			p.Type = "sagatest.v1.Nope"
			p.Headers["x-junk"] = "nul\x00"
		})
		// No message id at all: the envelope is invalid.
		b.send("no-id", doOK, func(p *amqp.Publishing) { p.MessageId = ""; p.CorrelationId = "corr-no-id" })

		for _, id := range []string{"perm", "undecodable", "unknown-type", "newer-schema", hostile, ""} {
			b.waitSettled(id, "park")
		}
		b.waitSettled("older-schema", "done")
		// The consumer keeps running.
		b.send("after", doOK, nil)
		b.waitSettled("after", "done")
		b.stop(r)

		require.Len(t, b.callsOf("perm"), 1, "a permanent failure is never retried")
		require.Empty(t, b.effects("perm"), "the failed handler's effect is rolled back")
		for _, id := range []string{"undecodable", "unknown-type", "newer-schema", hostile} {
			require.Empty(t, b.callsOf(id), "handler called for %q", id)
		}
		require.Equal(t, []int{1}, b.effects("older-schema"))

		rows := b.parked()
		require.Len(t, rows, 6)
		wantReason := map[string]string{
			"perm":              "order rejected",
			"undecodable":       "undecodable body",
			"unknown-type":      `unknown message type "sagatest.v1.Nope"`,
			"newer-schema":      "schema version mismatch",
			"bad\uFFFDid\uFFFD": "not valid UTF-8 text",
		}
		for id, reason := range wantReason {
			row, ok := rows[id]
			require.True(t, ok, "no saga_parked row for %q", id)
			require.Equal(t, "permanent", row.Class, id)
			require.Equal(t, 1, row.Attempts, id)
			require.Contains(t, row.Reason, reason, id)
		}
		var noID parkedRow
		for _, row := range rows {
			if row.CorrelationID == "corr-no-id" {
				noID = row
			}
		}
		require.NotEmpty(t, noID.MessageID, "a message without id is parked under a generated one")
		require.Contains(t, noID.Reason, "invalid envelope")
		require.Equal(t, "nul\uFFFD", rows["bad\uFFFDid\uFFFD"].Headers["x-junk"])

		// Exactly one parked copy per message: no loop.
		parked := b.drain(broker.ParkingQueue(b.queue))
		require.Len(t, parked, 6)
		for _, p := range parked {
			require.Equal(t, "permanent", header(t, p.Headers, message.HeaderParkClass))
			require.NotEmpty(t, header(t, p.Headers, message.HeaderParkReason))
			require.Equal(t, b.queue, header(t, p.Headers, message.HeaderOrigQueue))
			if p.CorrelationId == "corr-no-id" {
				require.Equal(t, noID.MessageID, p.MessageId)
			}
		}
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("ParkedUnderTheCanonicalSagaID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		// A saga id in another UUID form is stored in the form saga
		// tables, timelines and filters use.
		b.send("odd-id", doPermanent, func(p *amqp.Publishing) {
			p.Headers[message.HeaderSagaID] = "urn:uuid:0190B1E2-7C3A-7D4E-8F60-1A2B3C4D5E6F"
		})
		b.send("not-a-uuid", doPermanent, nil)
		b.waitSettled("odd-id", "park")
		b.waitSettled("not-a-uuid", "park")
		b.stop(r)
		rows := b.parked()
		require.Equal(t, "0190b1e2-7c3a-7d4e-8f60-1a2b3c4d5e6f", rows["odd-id"].SagaID)
		require.Equal(t, "saga-not-a-uuid", rows["not-a-uuid"].SagaID, "a saga id that is no UUID is kept as it came")
	})

	t.Run("ParkedAgainAfterADismissal", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		b.send("again", doPermanent, nil)
		b.waitSettled("again", "park")
		// An operator dismissed the open row; the same message parked
		// again is a new, open row (an open row would have kept one).
		_, err := b.pool.Exec(b.ctx, `UPDATE saga_parked SET dismissed_at = now(), dismissed_by = 'alice' WHERE message_id = 'again'`)
		require.NoError(t, err)
		b.mu.Lock()
		b.settled = nil
		b.mu.Unlock()
		b.send("again", doPermanent, nil)
		b.waitSettled("again", "park")
		b.stop(r)
		var open, dismissed int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE dismissed_at IS NULL), count(*) FILTER (WHERE dismissed_at IS NOT NULL)
FROM saga_parked WHERE message_id = 'again'`).Scan(&open, &dismissed))
		require.Equal(t, 1, open)
		require.Equal(t, 1, dismissed)
	})

	t.Run("ParkedWithoutSagaKeepsItsCorrelationKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		// A message that names no saga is found by its correlation field:
		// parking keeps it, to join the row to its saga. One that names a
		// saga needs none.
		b.send("no-saga", doPermanent, func(p *amqp.Publishing) { delete(p.Headers, message.HeaderSagaID) })
		b.send("with-saga", doPermanent, nil)
		b.waitSettled("no-saga", "park")
		b.waitSettled("with-saga", "park")
		b.stop(r)
		keys := map[string]string{}
		rows, err := b.pool.Query(b.ctx, `SELECT message_id, correlation_key FROM saga_parked`)
		require.NoError(t, err)
		var id, key string
		_, err = pgx.ForEachRow(rows, []any{&id, &key}, func() error { keys[id] = key; return nil })
		require.NoError(t, err)
		require.Equal(t, map[string]string{"no-saga": "key-" + doPermanent, "with-saga": ""}, keys)
	})

	t.Run("BrokenHandlerTransactionsAreRoutedNotLooped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(r, [2]string{"ok1", doOK}, [2]string{"swallow", doSwallow}, [2]string{"close-tx", doCloseTx},
			[2]string{"ok2", doOK},
			[2]string{"nul\x00id", doOK}) // a message id the inbox cannot store

		b.waitSettled("ok1", "done")
		b.waitSettled("ok2", "done")
		b.waitSettled("swallow", "park")
		b.waitSettled("close-tx", "park")
		b.waitSettled("nul\x00id", "park")
		b.stop(r)

		require.Equal(t, []int{1}, b.effects("ok1"))
		require.Equal(t, []int{1}, b.effects("ok2"))
		require.Empty(t, b.effects("swallow"))
		require.Empty(t, b.effects("close-tx"), "the effects a handler committed itself are undone")
		// The broken batch is applied again one by one, so attempt 1 may run twice.
		attempts := slices.Compact(b.attemptsOf("swallow"))
		require.Equal(t, []int{1, 2, 3}, attempts)
		rows := b.parked()
		require.Equal(t, 3, rows["swallow"].Attempts)
		require.Equal(t, "exhausted", rows["swallow"].Class)
		require.Contains(t, rows["swallow"].Reason, "a statement in its transaction failed")
		require.Equal(t, "permanent", rows["close-tx"].Class)
		require.Contains(t, rows["close-tx"].Reason, "committed or rolled back")
		require.Equal(t, "permanent", rows["nul\uFFFDid"].Class)
		require.Contains(t, rows["nul\uFFFDid"].Reason, "not valid UTF-8 text")
		require.Empty(t, b.callsOf("nul\x00id"))
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("PanicIsRetriedThenParked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		b.send("p1", doPanic, nil)
		b.waitSettled("p1", "park")
		b.send("after", doOK, nil)
		b.waitSettled("after", "done")
		b.stop(r)
		require.Equal(t, []int{1, 2, 3}, b.attemptsOf("p1"))
		require.Empty(t, b.effects("p1"))
		row := b.parked()["p1"]
		require.Equal(t, "exhausted", row.Class)
		require.Contains(t, row.Reason, "panic: boom")
	})

	t.Run("BatchIsolatesFailingDeliveries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.sendOneBatch(r, [2]string{"ok1", doOK}, [2]string{"bad", doPermanent}, [2]string{"ok2", doOK},
			[2]string{"flaky", doTransientOnce}, [2]string{"ok3", doOK})

		for _, id := range []string{"ok1", "ok2", "ok3"} {
			b.waitSettled(id, "done")
		}
		b.waitSettled("bad", "park")
		b.waitSettled("flaky", "done")
		b.stop(r)

		b.mu.Lock()
		var shared []string
		for _, ids := range b.batches {
			if slices.Contains(ids, "bad") {
				shared = ids
			}
		}
		b.mu.Unlock()
		require.Greater(t, len(shared), 1, "the failing delivery must have shared a batch: %v", shared)

		for _, id := range []string{"gate", "ok1", "ok2", "ok3"} {
			require.Equal(t, []int{1}, b.effects(id), id)
		}
		require.Empty(t, b.effects("bad"), "the failing delivery's savepoint is rolled back")
		require.Equal(t, []int{1}, b.attemptsOf("bad"), "the fallback must not run a failed delivery's handler again")
		_, fellBack := consumer.Paths(r.c)
		require.Positive(t, fellBack, "a failing handler in a shared batch falls back to savepoints")
		require.Equal(t, []int{2}, b.effects("flaky"))
		require.Equal(t, "permanent", b.parked()["bad"].Class)
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("RejectedBatchCommitIsAppliedOneByOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		b.send("gate", doBlock, nil)
		require.Equal(t, "gate", <-b.entered)
		for _, id := range []string{"ok1", "ok2"} {
			b.send(id, doOK, nil)
		}
		b.send("violates", doDeferred, nil)
		b.send("ok3", doOK, nil)
		require.Eventually(t, func() bool { return consumer.Buffered(r.c) == 4 }, testTimeout, poll)
		close(b.release)

		for _, id := range []string{"ok1", "ok2", "ok3"} {
			b.waitSettled(id, "done")
		}
		b.waitSettled("violates", "park")
		b.stop(r)

		for _, id := range []string{"gate", "ok1", "ok2", "ok3"} {
			require.Equal(t, []int{1}, b.effects(id), id)
		}
		require.Empty(t, b.effects("violates"))
		row := b.parked()["violates"]
		require.Equal(t, "permanent", row.Class)
		require.Contains(t, row.Reason, "23505")
		require.Zero(t, b.ready(b.queue))
	})

	t.Run("SurvivesBrokerConnectionLoss", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(nil, nil)
		var ids []string
		for i := range 60 {
			id := "k" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			ids = append(ids, id)
			b.send(id, doOK, nil)
		}
		require.Eventually(t, func() bool { return b.settledCount() >= 5 }, testTimeout, poll)
		require.Positive(t, testenv.KillAMQPConnections(t, b.amqpURL))
		for i := range 40 {
			id := "l" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			ids = append(ids, id)
			b.send(id, doOK, nil)
		}
		for _, id := range ids {
			// A batch that committed while its acknowledgement was lost
			// with the connection comes back, and its inbox claims make
			// the second handling a duplicate: settled either way, and
			// the effect counted below is applied once.
			b.waitSettledAs(id, "done", "duplicate")
		}
		b.stop(r)
		for _, id := range ids {
			require.Equal(t, []int{1}, b.effects(id), "message %s", id)
		}
		require.Zero(t, b.ready(b.queue))
		require.Empty(t, b.parked())
	})

	t.Run("SurvivesDatabaseLossWithoutSpendingAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 1 }, nil)
		b.send("gate", doBlock, nil)
		require.Equal(t, "gate", <-b.entered)
		// The handler holds an open transaction; the database goes away.
		require.Positive(t, testenv.KillPostgresConnections(t, b.pool))
		close(b.release)
		b.send("after", doOK, nil)
		b.waitSettled("gate", "done")
		b.waitSettled("after", "done")
		b.stop(r)

		calls := b.attemptsOf("gate")
		require.GreaterOrEqual(t, len(calls), 2, "the message must come back after the failed transaction")
		for _, a := range calls {
			require.Equal(t, 1, a, "a database outage must not spend retry attempts")
		}
		require.Equal(t, []int{1}, b.effects("gate"))
		require.Equal(t, []int{1}, b.effects("after"))
		require.Empty(t, b.parked())
		require.Zero(t, b.ready(b.queue))
		require.Zero(t, b.ready(broker.TierQueue(b.queue, 100*time.Millisecond)))
	})

	t.Run("GracefulShutdownDrainsInFlightWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 1 }, nil)
		b.send("slow", doBlock, nil)
		require.Equal(t, "slow", <-b.entered)
		r.cancel()
		close(b.release)
		select {
		case err := <-r.done:
			require.NoError(t, err)
			r.done <- nil
		case <-time.After(testTimeout):
			t.Fatal("consumer did not stop")
		}
		b.waitSettled("slow", "done")
		require.Equal(t, []int{1}, b.effects("slow"))
		require.Zero(t, b.ready(b.queue), "the in-flight message was acknowledged before the channel closed")
	})

	t.Run("MissingTopologyFailsAtStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, err := consumer.New(consumer.Config{
			Name: "x", Queue: "undeclared", Pool: b.pool, Conn: b.conn, Registry: b.reg, Handler: b.handle,
			Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(b.ctx, testTimeout)
		defer cancel()
		err = c.Run(ctx)
		require.ErrorContains(t, err, `queue "undeclared" does not exist`)
	})
}

// TestConsumerPrunesItsClaims: a running consumer deletes its own inbox
// claims older than KeepClaims, every PruneInterval, and nobody else's; a
// message whose claim is kept is still recognized when it comes again.
func TestConsumerPrunesItsClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
SELECT c, 'old-' || i, now() - interval '2 hours' FROM generate_series(1, 3) AS i, unnest(ARRAY['notes-consumer', 'other']) AS c`)
	require.NoError(t, err)
	claims := func(consumer, like string) (n int) {
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM saga_inbox WHERE consumer = $1 AND message_id LIKE $2`,
			consumer, like).Scan(&n))
		return n
	}

	r := b.start(func(c *consumer.Config) { c.KeepClaims = time.Hour; c.PruneInterval = 20 * time.Millisecond }, nil)
	b.send("kept", doOK, nil)
	b.waitSettled("kept", "done")
	require.Eventually(t, func() bool { return claims("notes-consumer", "old-%") == 0 }, testTimeout, poll,
		"the consumer's old claims were not pruned")
	require.EqualValues(t, 3, consumer.Pruned(r.c))
	require.Equal(t, 3, claims("other", "old-%"), "another consumer's claims were pruned")
	b.send("kept", doOK, nil)
	b.waitSettled("kept", "duplicate")
	b.stop(r)
	require.Equal(t, []int{1}, b.effects("kept"))
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()

	_, err := consumer.New(consumer.Config{})
	require.Error(t, err)
	for _, want := range []string{"Name is empty", "Queue is empty", "Pool is nil", "Conn is nil", "Registry is nil", "Handler is nil"} {
		require.ErrorContains(t, err, want)
	}

	_, err = consumer.New(consumer.Config{Name: "n", Prefetch: 70000, Retry: retry.Policy{MaxAttempts: 3}})
	require.ErrorContains(t, err, "Prefetch is 70000")
	require.ErrorContains(t, err, "needs at least one tier")
	require.True(t, strings.HasPrefix(err.Error(), `consumer "n" config:`))

	prune := func(context.Context, time.Time) (int64, error) { return 0, nil }
	_, err = consumer.New(consumer.Config{Name: "n", PruneDedupes: prune})
	require.ErrorContains(t, err, "PruneDedupes is set without HandlerDedupes")
	_, err = consumer.New(consumer.Config{Name: "n", PruneDedupes: prune, HandlerDedupes: true})
	require.NotContains(t, err.Error(), "PruneDedupes")
}
