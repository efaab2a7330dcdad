package saga_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestUnclaimedQueueDropsRedeliveries runs the engine behind a consumer that
// claims nothing in the inbox (consumer.Config.HandlerDedupes, as a host runs
// its sagas' queues), with one worker so that messages are handled in the
// order they were sent. The same message sent again is a redelivery (a lost
// acknowledgement, a consumer killed between commit and ack, a relay that
// published twice): a reply the engine applied as new is claimed nowhere,
// and its redeliveries are duplicates by the saga's own record, audited once
// and then dropped by the claim that audit made; a conflicting reply, which
// the saga's record cannot tell from a new conflict, is claimed when it is
// handled, and its redelivery has no effect at all (no second audit row, the
// review reason not repeated). Copies sent back to back may share a batch.
func TestUnclaimedQueueDropsRedeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	quiet := slog.New(slog.DiscardHandler)
	amqpURL := testenv.AMQP(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, amqpURL, broker.ConnConfig{Name: name, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	consume, publish := dial("consume"), dial("publish")
	const queue, name = "test.saga.unclaimed", "test-saga-unclaimed"
	ch, err := publish.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{Queues: broker.WorkQueue(queue, broker.QueueQuorum, retry.Default())}))
	require.NoError(t, ch.Confirm(false))
	c, err := consumer.New(consumer.Config{Name: name, HandlerDedupes: true, Queue: queue, Pool: b.pool, Conn: consume,
		PublishConn: publish, Registry: testRegistry, Batch: b.engine, Concurrency: 1, BatchSize: 8, Logger: quiet})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	send := func(envs ...message.Envelope) {
		t.Helper()
		for _, env := range envs {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, env.Publishing())
			require.NoError(t, err)
			require.True(t, dc.Wait(), "publish %s", env.MessageID)
		}
	}
	reply := func(id string, in *message.Info, causation string) message.Envelope {
		t.Helper()
		env, err := message.New(msg(in, b.status(t, id).BusinessKey), message.Meta{SagaID: id, SagaType: b.def.Name, CausationID: causation})
		require.NoError(t, err)
		return env
	}
	claimed := func(messageID string) int {
		t.Helper()
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_inbox WHERE consumer = $1 AND message_id = $2`, name, messageID).Scan(&n))
		return n
	}
	// markers: a reply to a saga of its own, sent after the messages under
	// test; with one worker, once it is applied they were handled.
	marker := 0
	handledUpTo := func() {
		t.Helper()
		marker++
		id := b.start(t, "marker-"+string(rune('a'+marker)))
		send(reply(id, msgInventoryReserved, b.status(t, id).PendingMessageID))
		require.Eventually(t, func() bool { return b.status(t, id).State == stPayment }, 30*time.Second, 20*time.Millisecond,
			"the marker sent after the messages under test is applied")
	}

	// A reply applied as new: no inbox claim; the saga's record names it.
	one := b.start(t, "o-1")
	reserved := reply(one, msgInventoryReserved, b.status(t, one).PendingMessageID)
	send(reserved)
	require.Eventually(t, func() bool { return b.status(t, one).State == stPayment }, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, claimed(reserved.MessageID), "a message applied as new is not claimed in the inbox")

	// Its redeliveries, two copies back to back.
	send(reserved, reserved)
	handledUpTo()
	st := b.status(t, one)
	require.Equal(t, stPayment, st.State)
	require.EqualValues(t, 2, st.Version, "advanced once")
	require.Equal(t, []string{"InventoryReserved"}, applied(t, st))
	require.Equal(t, []string{"start:new:>RESERVE_INVENTORY", "InventoryReserved:new:RESERVE_INVENTORY>AUTHORIZE_PAYMENT",
		"InventoryReserved:duplicate:AUTHORIZE_PAYMENT>AUTHORIZE_PAYMENT"}, trail(b.history(t, one)),
		"the first redelivery is audited as a duplicate, the second dropped by the claim that made")
	require.Equal(t, 1, claimed(reserved.MessageID))
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, one)), "no command sent twice")

	// A conflicting reply: manual review once, however often it arrives.
	two := b.start(t, "o-2")
	cmd := b.status(t, two).PendingMessageID
	send(reply(two, msgInventoryReserved, cmd))
	require.Eventually(t, func() bool { return b.status(t, two).State == stPayment }, 30*time.Second, 20*time.Millisecond)
	failed := reply(two, msgInventoryFailed, cmd)
	send(failed)
	require.Eventually(t, func() bool { return b.status(t, two).State == stManualReview }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, claimed(failed.MessageID), "a conflicting reply is claimed when it is handled")
	review := b.status(t, two)
	send(failed, failed)
	handledUpTo()
	after := b.status(t, two)
	require.Equal(t, review.Version, after.Version, "the redeliveries changed nothing")
	require.Equal(t, review.ReviewReason, after.ReviewReason)
	require.Equal(t, 1, strings.Count(after.ReviewReason, "conflicting"), after.ReviewReason)
	conflicts := 0
	for _, a := range b.history(t, two) {
		if a.MessageID == failed.MessageID {
			require.Equal(t, sagadef.ClassConflicting.String(), a.Class)
			conflicts++
		}
	}
	require.Equal(t, 1, conflicts, "one audit row for the conflicting reply")
}
