package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
)

// returnUnacked takes the queue's ready messages and gives them back
// unacknowledged, times times over, as a consumer that died holding them
// would: the quorum queue counts each return in x-delivery-count. Each
// round holds every message before returning them, so each is counted once
// per round wherever the queue puts a returned message (RabbitMQ 3.10 and
// 4.0 differ there: returning one at a time, 4.0 hands the same one back).
func (b *testBundle) returnUnacked(times, messages int) {
	b.t.Helper()
	ch, err := b.pubConn.Channel(b.ctx)
	require.NoError(b.t, err)
	defer func() { _ = ch.Close() }()
	for range times {
		var held []amqp.Delivery
		for range messages {
			d, ok, err := ch.Get(b.queue, false)
			require.NoError(b.t, err)
			require.True(b.t, ok, "a message is missing from %s", b.queue)
			held = append(held, d)
		}
		for _, d := range held {
			require.NoError(b.t, d.Nack(false, true))
		}
	}
}

func (b *testBundle) suspects() int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM saga_consumer_suspect`).Scan(&n))
	return n
}

// TestRedeliveryGuard: a message whose handling keeps stopping the consumer
// is redelivered until MaxRedeliveries, then handled alone once more under a
// suspect record; when that stops the consumer too, the next delivery finds
// the record and parks the message without running its handler again.
func TestRedeliveryGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	edit := func(c *consumer.Config) { c.MaxRedeliveries = 2; c.DrainTimeout = 50 * time.Millisecond }
	b.send("crasher", doStopConsumer, nil)
	b.send("bystander", doOK, nil)
	// Deliveries 1 and 2 (x-delivery-count 0 and 1) stop the consumer;
	// delivery 3 (count 2) is handled alone under a suspect record and
	// stops it again; delivery 4 is parked.
	for run := 1; run <= 3; run++ {
		r := b.start(edit, nil)
		select {
		case err := <-r.done:
			require.NoError(t, err)
			r.done <- nil // for the cleanup
		case <-time.After(testTimeout):
			t.Fatalf("run %d: the consumer did not stop", run)
		}
		if run == 3 {
			require.Equal(t, 1, b.suspects(), "the record of the handling that never finished")
		}
	}
	r := b.start(edit, nil)
	b.waitSettled("crasher", "park")
	// Handled in a batch of its own that committed before a stop took its
	// acknowledgement, the bystander comes back as a duplicate; either way
	// its effect is there once.
	b.waitSettledAs("bystander", "done", "duplicate")
	b.stop(r)

	require.Len(t, b.callsOf("crasher"), 3, "not run a fourth time")
	require.Equal(t, []int{1}, b.effects("bystander"), "the message delivered alongside it is handled normally")
	row := b.parked()["crasher"]
	require.Equal(t, "permanent", row.Class)
	require.Contains(t, row.Reason, "redelivered 3 times without an acknowledgement (MaxRedeliveries 2)")
	require.Contains(t, row.Reason, "stopped the consumer")
	require.Equal(t, "saga-crasher", row.SagaID)
	require.Len(t, b.parked(), 1)
	require.Zero(t, b.suspects(), "the record goes with the parking")

	parked := b.drain(broker.ParkingQueue(b.queue))
	require.Len(t, parked, 1)
	count, _, err := message.HeaderInt(parked[0].Headers, "x-delivery-count")
	require.NoError(t, err)
	require.Zero(t, count, "the parked copy starts counting afresh")
	require.Zero(t, b.ready(b.queue))
}

// TestRedeliveryGuardSparesOthers: messages over the limit whose handling
// did not stop anything — only prefetched alongside a culprit, or already
// handled once — are handled alone and normally, or acknowledged as
// duplicates, and leave no record.
func TestRedeliveryGuardSparesOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("innocent", doOK, nil)
	b.send("handled", doOK, nil)
	b.returnUnacked(3, 2)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO saga_inbox (consumer, message_id) VALUES ('notes-consumer', 'handled')`)
	require.NoError(t, err)
	// Its commit landed and the consumer died before the ack, with the
	// record still there: a duplicate all the same.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO saga_consumer_suspect (consumer, message_id, redeliveries) VALUES ('notes-consumer', 'handled', 3)`)
	require.NoError(t, err)

	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = 3 }, nil)
	b.waitSettled("innocent", "done")
	b.waitSettled("handled", "duplicate")
	b.stop(r)
	require.Equal(t, []int{1}, b.effects("innocent"))
	require.Empty(t, b.callsOf("handled"))
	require.Empty(t, b.parked())
	require.Zero(t, b.suspects())
}

func TestRedeliveryGuardOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("again", doOK, nil)
	b.returnUnacked(4, 1)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO saga_consumer_suspect (consumer, message_id, redeliveries) VALUES ('notes-consumer', 'again', 4)`)
	require.NoError(t, err)
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = -1 }, nil)
	b.waitSettled("again", "done")
	b.stop(r)
	require.Equal(t, []int{1}, b.effects("again"))
	require.Empty(t, b.parked())
}

// TestRedeliveryGuardSparesADatabaseLoss: a message over the limit, handled
// alone under a suspect record, whose transaction dies with the database
// connection, did not stop the consumer: the consumer saw the error, so its
// next delivery runs the handler again instead of parking the message.
func TestRedeliveryGuardSparesADatabaseLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("g", doBlock, nil)
	b.returnUnacked(3, 1)
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = 3; c.Concurrency = 1; c.BatchSize = 1 }, nil)
	require.Equal(t, "g", <-b.entered)
	require.Equal(t, 1, b.suspects())
	require.Positive(t, testenv.KillPostgresConnections(t, b.pool))
	close(b.release)
	b.waitSettled("g", "done")
	b.stop(r)
	require.Len(t, b.callsOf("g"), 2, "run again after the failed transaction")
	require.Equal(t, []int{1}, b.effects("g"))
	require.Empty(t, b.parked())
	require.Zero(t, b.suspects())
}

// TestRedeliveryGuardClearsARejectedCommit: a message over the limit whose
// commit the server rejects (a deferred constraint) is routed to retry
// without a transaction of its own; its suspect record must still go, or
// a later redelivery of the same message would be parked on sight.
func TestRedeliveryGuardClearsARejectedCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
CREATE FUNCTION reject_first() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.message_id = 'dt' AND NEW.attempt = 1 THEN RAISE EXCEPTION 'rejected at commit'; END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER reject_first AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION reject_first();`)
	require.NoError(t, err)
	b.send("dt", doOK, nil)
	b.returnUnacked(3, 1)
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = 3 }, nil)
	b.waitSettled("dt", "retry")
	b.waitSettled("dt", "done")
	b.stop(r)
	require.Equal(t, []int{1, 2}, b.attemptsOf("dt"))
	require.Equal(t, []int{2}, b.effects("dt"))
	require.Zero(t, b.suspects(), "the suspect record outlived the message's handling")
}

// TestRedeliveryGuardParksAHangInOneProcess: a handling that hangs until
// the drain cancels it stops the consumer, even when the same Consumer's
// Run is called again in the same process: the guard parks the message as
// it does across processes, instead of taking the cancelled handling for
// an error it merely saw.
func TestRedeliveryGuardParksAHangInOneProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("crasher", doStopConsumer, nil)
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = 2; c.DrainTimeout = 50 * time.Millisecond }, nil)
	require.NoError(t, <-r.done, "run 1")
	for run := 2; run <= 4; run++ {
		ctx, cancel := context.WithCancel(b.ctx)
		b.mu.Lock()
		b.stopRun = cancel
		b.mu.Unlock()
		done := make(chan error, 1)
		go func() { done <- r.c.Run(ctx) }()
		if run == 4 {
			b.waitSettled("crasher", "park")
			cancel()
		}
		select {
		case err := <-done:
			require.NoError(t, err, "run %d", run)
		case <-time.After(testTimeout):
			t.Fatalf("run %d did not stop", run)
		}
		cancel()
	}
	r.done <- nil // for the cleanup
	require.Len(t, b.callsOf("crasher"), 3, "not run a fourth time")
	require.Contains(t, b.parked()["crasher"].Reason, "stopped the consumer")
}

// TestSessionClearsTheSuspectsItSawFail: the suspect records of handlings
// this process saw end with an error are deleted once a session starts,
// so a redelivery to another process is not parked for them either.
func TestSessionClearsTheSuspectsItSawFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO saga_consumer_suspect (consumer, message_id, redeliveries)
VALUES ('notes-consumer', 'seen-fail', 3), ('notes-consumer', 'never-seen', 3)`)
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{Name: "notes-consumer", Queue: b.queue, Pool: b.pool, Conn: b.conn,
		Registry: b.reg, Handler: b.handle, Retry: b.policy})
	require.NoError(t, err)
	consumer.Interrupted(c, "seen-fail")
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var left []string
	require.Eventually(t, func() bool {
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT array_agg(message_id) FROM saga_consumer_suspect`).Scan(&left))
		return len(left) == 1
	}, testTimeout, poll)
	require.Equal(t, []string{"never-seen"}, left, "only the record of a handling this process saw fail goes")
	cancel()
	require.NoError(t, <-done)
}

// TestRedeliveryGuardParksARecurringCommitFailure: a database error at
// commit that the message's own content causes every time (out of shared
// memory, an internal error on the row it touches) is spared only
// maxSpared times, then the guard parks the message instead of letting it
// come back for ever.
func TestRedeliveryGuardParksARecurringCommitFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, failPoisonAtCommit)
	require.NoError(t, err)
	b.send("poison", doOK, nil)
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = 3; c.Concurrency = 1; c.BatchSize = 1 }, nil)
	b.waitSettled("poison", "park")
	b.stop(r)
	require.Empty(t, b.effects("poison"))
	reason := b.parked()["poison"].Reason
	require.Contains(t, reason, "failed 3 times in a row with a database error")
	require.Contains(t, reason, "out of shared memory, every time")
	require.NotContains(t, reason, "stopped the consumer")
	require.Zero(t, b.suspects())
}

// TestRedeliveryGuardClearsBeforeAnotherProcess: a suspect handling that
// loses its database connection is spared by every process, not only by
// the one that saw it fail: its record is deleted before the delivery goes
// back to the queue, so an idle consumer of another process that gets the
// redelivery runs it instead of parking it.
func TestRedeliveryGuardClearsBeforeAnotherProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("g", doBlock, nil)
	b.returnUnacked(3, 1)
	edit := func(c *consumer.Config) { c.MaxRedeliveries = 3; c.Concurrency = 1; c.BatchSize = 1 }
	ra := b.start(edit, nil)
	require.Equal(t, "g", <-b.entered)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] += "-other-process"
	other, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(other.Close)
	rb := b.start(func(c *consumer.Config) { edit(c); c.Pool = other }, nil)
	require.Eventually(t, func() bool { return testenv.QueueConsumers(t, b.amqpURL, b.queue) == 2 }, testTimeout, poll)
	require.Positive(t, testenv.KillPostgresConnections(t, b.pool))
	close(b.release)
	b.waitSettled("g", "done")
	b.stop(ra)
	b.stop(rb)
	require.Empty(t, b.parked(), "parked for a record of a handling that merely failed")
	require.Equal(t, []int{1}, b.effects("g"))
}

// TestRedeliveryGuardOnAClassicQueue: a classic queue does not count
// deliveries (no x-delivery-count), so the consumer counts the
// redeliveries it sees itself: a message whose handling fails with a
// database error every time (here, at commit) is parked as on a quorum
// queue instead of coming back for ever.
func TestRedeliveryGuardOnAClassicQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.queue = "classic-notes"
	ch, err := b.conn.Channel(b.ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(b.ctx, ch, broker.Topology{
		Queues:   broker.WorkQueue(b.queue, broker.QueueClassic, b.policy),
		Bindings: []broker.Binding{{Queue: b.queue, Exchange: "events", RoutingKey: "note.#"}},
	}))
	require.NoError(t, ch.Close())
	_, err = b.pool.Exec(b.ctx, failPoisonAtCommit)
	require.NoError(t, err)
	b.send("poison", doOK, nil)
	const maxRedeliveries = 3
	r := b.start(func(c *consumer.Config) { c.MaxRedeliveries = maxRedeliveries; c.Concurrency = 1; c.BatchSize = 1 }, nil)
	b.waitSettled("poison", "park")
	b.send("after", doOK, nil)
	b.waitSettled("after", "done")
	b.stop(r)
	require.Len(t, b.callsOf("poison"), maxRedeliveries+3)
	require.Empty(t, b.effects("poison"))
	require.Contains(t, b.parked()["poison"].Reason, "failed 3 times in a row with a database error")
	require.Zero(t, b.suspects())
}

// failPoisonAtCommit makes every commit that wrote the effect of the message
// "poison" fail, the same database error each time (a deferred constraint
// trigger raising 53200).
const failPoisonAtCommit = `
CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.message_id = 'poison' THEN RAISE EXCEPTION 'out of shared memory, every time' USING ERRCODE = '53200'; END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION fail_commit();`
