package consumer_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
)

// copies is the queue that takes what the test handlers write to the
// outbox.
const copies = "copies"

// runRelay runs an outbox relay until the returned stop (or the test's
// cleanup). It returns once the relay has published a probe row, so that it
// is known to be running.
func (b *testBundle) runRelay(owner string) (*outbox.Relay, func()) {
	b.t.Helper()
	conn, err := broker.Dial(b.ctx, b.amqpURL, broker.ConnConfig{Name: "relay " + owner})
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = conn.Close() })
	r := b.newRelay(owner, conn)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(b.t, err)
		case <-time.After(testTimeout):
			b.t.Fatal("relay did not stop")
		}
	}
	b.t.Cleanup(stop)
	probe := "probe-" + owner
	require.NoError(b.t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.Enqueue(b.ctx, tx, message.Envelope{MessageID: probe, MessageType: noteInfo.FullName,
			SchemaVersion: 1, Exchange: "events", RoutingKey: copyKey})
	}))
	b.waitPublished(probe)
	return r, stop
}

func (b *testBundle) newRelay(owner string, conn *broker.Conn) *outbox.Relay {
	b.t.Helper()
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Conn: conn, Owner: owner,
		PollInterval: 50 * time.Millisecond, LeaseDuration: time.Minute})
	require.NoError(b.t, err)
	return r
}

func (b *testBundle) waitPublished(messageID string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		var published bool
		err := b.pool.QueryRow(b.ctx, `SELECT published_at IS NOT NULL FROM saga_outbox_state WHERE message_id = $1`, messageID).Scan(&published)
		return err == nil && published
	}, testTimeout, poll, "outbox row %s never published", messageID)
}

// waitPublishedCount waits for r to count want rows published: it counts
// a settle once its statement has returned, a moment after the rows show
// as published.
func (b *testBundle) waitPublishedCount(r *outbox.Relay, want int64) {
	b.t.Helper()
	require.Eventually(b.t, func() bool { return r.Stats().Published == want }, testTimeout, poll,
		"relay counted %d published, want %d", r.Stats().Published, want)
	time.Sleep(2 * poll)
	require.Equal(b.t, want, r.Stats().Published, "and no more")
}

// outboxRow is what the relay left on an outbox row.
type outboxRow struct {
	published  bool
	attempts   int
	owner      string // the relay that published it, or that holds its lease; "" for none
	bornLeased bool   // its lease (or the one it was published under) began with its insert
}

func (b *testBundle) outboxRow(messageID string) (outboxRow, bool) {
	b.t.Helper()
	var r outboxRow
	err := b.pool.QueryRow(b.ctx, `SELECT s.published_at IS NOT NULL, s.attempts, coalesce(s.published_by, s.lease_owner, ''),
  coalesce(o.lease_owner = coalesce(s.published_by, s.lease_owner) AND s.attempts = 1
    AND o.lease_until = o.created_at + interval '1 minute', false)
FROM saga_outbox_state s JOIN saga_outbox o ON o.id = s.id WHERE s.message_id = $1`, messageID).Scan(&r.published, &r.attempts, &r.owner, &r.bornLeased)
	if err == pgx.ErrNoRows {
		return r, false
	}
	require.NoError(b.t, err)
	return r, true
}

func (b *testBundle) declareCopies() {
	b.t.Helper()
	ch, err := b.conn.Channel(b.ctx)
	require.NoError(b.t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(b.t, broker.Declare(b.ctx, ch, broker.Topology{
		Queues:   []broker.Queue{{Name: copies, Type: broker.QueueClassic}},
		Bindings: []broker.Binding{{Queue: copies, Exchange: "events", RoutingKey: copyKey}},
	}))
}

func (b *testBundle) copiesReceived() []string {
	var ids []string
	for _, d := range b.drain(copies) {
		ids = append(ids, d.MessageId)
	}
	sort.Strings(ids)
	return ids
}

func TestHandOffToLocalRelay(t *testing.T) {
	t.Parallel()

	t.Run("CommittedRowsOnlyAndWithoutAClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.declareCopies()
		r, _ := b.runRelay("local")
		b.relay = r
		c := b.start(func(c *consumer.Config) { c.Concurrency = 1; c.BatchSize = 16 }, nil)
		// One batch: two handlers that write to the outbox and commit, and
		// two that write and then fail. The first failure (e2) rolls the
		// fast path back; the batch is applied again with savepoints, where
		// e4 fails and rolls back its own savepoint.
		b.sendOneBatch(c, [2]string{"e1", doEnqueue}, [2]string{"e2", doEnqueueFail}, [2]string{"e3", doEnqueue},
			[2]string{"e4", doEnqueueFail})
		b.waitSettled("e1", "done")
		b.waitSettled("e3", "done")
		b.waitSettled("e2", "park")
		b.waitSettled("e4", "park")
		b.waitPublished("e1-out")
		b.waitPublished("e3-out")
		b.stop(c)

		_, fellBack := consumer.Paths(c.c)
		require.Positive(t, fellBack, "the failing handler must have sent the batch down the savepoint path")
		for _, id := range []string{"e2-out", "e4-out"} {
			_, exists := b.outboxRow(id)
			require.False(t, exists, "the failed handler's outbox row %s is rolled back", id)
		}
		for _, id := range []string{"e1-out", "e3-out"} {
			row, ok := b.outboxRow(id)
			require.True(t, ok)
			require.Equal(t, outboxRow{published: true, attempts: 1, owner: "local", bornLeased: true}, row,
				"%s: born leased to the local relay and published under that lease, never claimed", id)
		}
		require.Equal(t, int64(2), r.Stats().HandedOff, "the two committed rows were handed over, not claimed")
		b.waitPublishedCount(r, 3) // the probe, e1-out and e3-out
		require.Eventually(t, func() bool { return b.ready(copies) == 3 }, testTimeout, poll)
		require.Equal(t, []string{"e1-out", "e3-out", "probe-local"}, b.copiesReceived(),
			"each committed row published once, the rolled-back ones never")
	})

	t.Run("RelayNotRunningLeavesRowsToClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.declareCopies()
		conn, err := broker.Dial(b.ctx, b.amqpURL, broker.ConnConfig{Name: "idle relay"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		idle := b.newRelay("idle", conn)
		b.relay = idle
		c := b.start(nil, nil)
		b.send("e1", doEnqueue, nil)
		b.waitSettled("e1", "done")
		b.stop(c)
		row, ok := b.outboxRow("e1-out")
		require.True(t, ok)
		require.Equal(t, outboxRow{}, row, "a relay that is not running is not handed anything: the row waits unleased")

		other, _ := b.runRelay("other")
		b.waitPublished("e1-out")
		row, _ = b.outboxRow("e1-out")
		require.Equal(t, outboxRow{published: true, attempts: 1, owner: "other"}, row, "claimed: leased after its insert")
		require.Zero(t, idle.Stats().HandedOff)
		require.Zero(t, other.Stats().HandedOff)
		b.waitPublishedCount(other, 2) // the probe and the claimed row
	})

	t.Run("RelayStoppedBeforeCommitReleasesRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.declareCopies()
		r, stopRelay := b.runRelay("leaving")
		b.relay = r
		c := b.start(nil, nil)
		stops := 0
		// After the insert leased the row to the relay, before the commit.
		consumer.SetBeforeCommit(c.c, func() {
			stops++
			stopRelay()
		})
		b.send("h", doEnqueue, nil)
		b.waitSettled("h", "done")
		b.stop(c)
		require.Equal(t, 1, stops, "one batch")
		fast, fellBack := consumer.Paths(c.c)
		require.Equal(t, int64(1), fast)
		require.Zero(t, fellBack, "the fast path staged the row and wrote it leased just before the commit")

		row, ok := b.outboxRow("h-out")
		require.True(t, ok)
		require.Equal(t, outboxRow{attempts: 1}, row, "the stopped relay's lease is released at once, not left to run out")
		require.Zero(t, r.Stats().HandedOff)

		// The lease was a minute long: only the release lets another relay
		// publish the row within the test's timeout.
		other, _ := b.runRelay("other")
		b.waitPublished("h-out")
		b.waitPublishedCount(other, 2)
		require.Eventually(t, func() bool { return b.ready(copies) == 3 }, testTimeout, poll)
		require.Equal(t, []string{"h-out", "probe-leaving", "probe-other"}, b.copiesReceived())
	})
}
