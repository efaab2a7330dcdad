package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
)

// out builds n messages to the routed queue (declareRouted), ids prefix-0….
func out(prefix string, n int) []broker.Outgoing {
	msgs := make([]broker.Outgoing, n)
	for i := range msgs {
		msgs[i] = broker.Outgoing{Exchange: "ex", RoutingKey: "routed", Publishing: msg(fmt.Sprintf("%s-%d", prefix, i))}
	}
	return msgs
}

func TestPublisherSendOverlapsBatches(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)

	// Five batches go out before any is awaited, through a window smaller
	// than their total, with unroutable messages spread over all of them:
	// each outcome must land on its own message.
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{Window: 8})
	var sends []*broker.Pending
	var batches [][]broker.Outgoing
	for k := range 5 {
		msgs := out(fmt.Sprint("b", k), 12)
		for i := range msgs {
			if (k*12+i)%5 == 2 {
				msgs[i].RoutingKey = "nobody-listens"
			}
		}
		batches = append(batches, msgs)
		sends = append(sends, p.Send(ctx, msgs))
	}
	routed := map[string]bool{}
	for k := len(sends) - 1; k >= 0; k-- { // await out of order, too
		errs := sends[k].Wait(ctx)
		require.Len(t, errs, 12)
		for i, err := range errs {
			if (k*12+i)%5 == 2 {
				require.ErrorIs(t, err, broker.ErrReturned, "batch %d message %d", k, i)
			} else {
				require.NoError(t, err, "batch %d message %d", k, i)
				routed[batches[k][i].Publishing.MessageId] = true
			}
		}
	}
	for range len(routed) {
		d := get(t, ctx, b.ch, "routed")
		require.True(t, routed[d.MessageId], "unexpected message %s", d.MessageId)
		delete(routed, d.MessageId)
	}
	require.Empty(t, routed)
}

func TestPublisherNackInPipelinedBatch(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, amqp.Table{"x-max-length": int64(3), "x-overflow": "reject-publish"})

	// The queue takes three: the third message of the second batch and
	// everything after it is nacked, and only those.
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{Window: 16})
	first, second := p.Send(ctx, out("a", 2)), p.Send(ctx, out("b", 3))
	third := p.Send(ctx, out("c", 2))
	require.Equal(t, []error{nil, nil}, first.Wait(ctx))
	errs := second.Wait(ctx)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], broker.ErrNacked)
	require.ErrorIs(t, errs[2], broker.ErrNacked)
	for _, err := range third.Wait(ctx) {
		require.ErrorIs(t, err, broker.ErrNacked)
	}
	// Nacks keep the channel: once there is room, the next batch goes out.
	get(t, ctx, b.ch, "routed")
	require.Equal(t, []error{nil}, p.Publish(ctx, out("d", 1)))
}

// A message AMQP cannot carry fails alone, unsent; the channel, and every
// other message of the batch, go on. Written to the connection, it would
// have closed the connection and failed them all.
func TestPublisherRefusesUnsendableMessages(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
	require.Equal(t, []error{nil}, p.Publish(ctx, out("warm", 1)))
	require.Equal(t, "warm-0", get(t, ctx, b.ch, "routed").MessageId)

	msgs := out("m", 6)
	long := strings.Repeat("x", 256)
	msgs[1].Publishing.CorrelationId = long
	msgs[2].RoutingKey = long
	msgs[3].Publishing.Headers = amqp.Table{"nested": amqp.Table{long: 1}}
	msgs[4].Publishing.Headers = amqp.Table{"f": func() {}}
	errs := p.Publish(ctx, msgs)
	for i, want := range []string{"", "correlation id is 256 bytes", "routing key is 256 bytes", `header "nested": message cannot be sent over AMQP: header name xxx`, "value func() not supported", ""} {
		if want == "" {
			require.NoError(t, errs[i], "message %d", i)
			continue
		}
		require.ErrorIs(t, errs[i], broker.ErrInvalidMessage, "message %d", i)
		require.ErrorContains(t, errs[i], want)
	}
	require.Equal(t, "m-0", get(t, ctx, b.ch, "routed").MessageId)
	require.Equal(t, "m-5", get(t, ctx, b.ch, "routed").MessageId)
	require.False(t, b.ch.IsClosed(), "the connection (and the test's channel on it) was closed")
}

// TestPublisherStalledConfirms holds back everything the broker sends (a
// proxy stops forwarding), so confirms stay outstanding for as long as the
// test wants.
func TestPublisherStalledConfirms(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)
	px := testenv.NewProxy(t, b.url)
	conn, err := broker.Dial(ctx, px.URL, broker.ConnConfig{Name: t.Name(), Heartbeat: time.Minute, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { px.Hold(false); _ = conn.Close() })
	p := broker.NewPublisher(conn, broker.PublisherConfig{Window: 4, ConfirmTimeout: 2 * time.Second})
	require.Equal(t, []error{nil}, p.Publish(ctx, out("warm", 1))) // channel open, exchange checked

	px.Hold(true)
	// The window counts across batches: three messages of one batch and
	// one of the next fill it, and the rest of the second batch cannot be
	// sent before its ctx ends.
	first := p.Send(ctx, out("a", 3))
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	second := p.Send(short, out("b", 3))
	errs := second.Wait(ctx)
	require.ErrorIs(t, errs[1], broker.ErrNotSent)
	require.ErrorIs(t, errs[1], context.DeadlineExceeded)
	require.ErrorIs(t, errs[2], broker.ErrNotSent)
	// errs[0] was sent; it fails with everything outstanding when the
	// confirm timeout gives up on the channel.
	require.ErrorIs(t, errs[0], broker.ErrConfirmTimeout)
	for _, err := range first.Wait(ctx) {
		require.ErrorIs(t, err, broker.ErrConfirmTimeout)
	}

	// A caller may stop waiting sooner; the messages then count as failed.
	px.Hold(false)
	require.Equal(t, []error{nil}, p.Publish(ctx, out("fresh", 1)), "a new channel after the timeout")
	px.Hold(true)
	pending := p.Send(ctx, out("c", 2))
	start := time.Now()
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	for _, err := range pending.Wait(short) {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	require.Less(t, time.Since(start), time.Second, "Wait returns when its ctx ends")

	// Close fails what is still outstanding instead of leaving it waiting.
	pending = p.Send(ctx, out("d", 1))
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = p.Close()
	}()
	require.ErrorIs(t, pending.Wait(ctx)[0], broker.ErrChannelClosed)
	px.Hold(false) // the channel's close-ok
	<-closed
}

// TestPublisherUnderAResourceAlarm raises a real memory alarm on a broker of
// the test's own: the broker blocks the publishing connection, the Conn
// reports it, and the publisher fails messages at once with ErrBlocked
// instead of writing into a connection nobody reads. Once the alarm clears,
// publishing goes on.
func TestPublisherUnderAResourceAlarm(t *testing.T) {
	t.Parallel()
	svc := testenv.PrivateServices(t)
	ctx := testCtx(t)
	conn, err := broker.Dial(ctx, svc.AMQPURL, broker.ConnConfig{Name: t.Name()})
	require.NoError(t, err)
	t.Cleanup(func() { go func() { _ = conn.Close() }() })
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	declareRouted(t, ctx, ch, nil)
	p := broker.NewPublisher(conn, broker.PublisherConfig{ConfirmTimeout: 2 * time.Second})
	require.Equal(t, []error{nil}, p.Publish(ctx, out("before", 1)))

	_, err = svc.RabbitCtl(ctx, "set_vm_memory_high_watermark", "0.000001")
	require.NoError(t, err)
	cleared := false
	clear := func() {
		if !cleared {
			_, err := svc.RabbitCtl(context.Background(), "set_vm_memory_high_watermark", "0.4")
			require.NoError(t, err)
			cleared = true
		}
	}
	t.Cleanup(clear)
	require.Eventually(t, func() bool {
		alarms, err := svc.RabbitCtl(ctx, "eval", "rabbit_alarm:get_alarms().")
		return err == nil && strings.Contains(alarms, "memory")
	}, 30*time.Second, 100*time.Millisecond, "no memory alarm")
	// The broker blocks a connection when it next publishes: this message
	// is read, then waits for its confirm until the alarm clears.
	first := p.Send(ctx, out("first", 1))
	require.Eventually(t, func() bool { _, blocked := conn.Blocked(); return blocked }, 30*time.Second, 50*time.Millisecond,
		"the broker did not block the connection")
	reason, _ := conn.Blocked()
	require.NotEmpty(t, reason)
	for _, err := range p.Publish(ctx, out("during", 3)) {
		require.ErrorIs(t, err, broker.ErrBlocked)
		require.ErrorIs(t, err, broker.ErrNotSent)
	}

	clear()
	require.Eventually(t, func() bool { _, blocked := conn.Blocked(); return !blocked }, 30*time.Second, 50*time.Millisecond,
		"the broker did not unblock the connection")
	require.Equal(t, []error{nil}, p.Publish(ctx, out("after", 1)))
	// The message that met the alarm was read by the broker: confirmed
	// once the alarm cleared, or failed by the confirm timeout before.
	t.Log("the message that met the alarm:", first.Wait(ctx)[0])
	for _, id := range []string{"before-0", "first-0", "after-0"} {
		require.Equal(t, id, get(t, ctx, ch, "routed").MessageId)
	}
}
