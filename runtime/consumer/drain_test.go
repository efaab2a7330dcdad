package consumer_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
)

// TestShutdownBoundedWhenTheBrokerStopsAnswering: a consumer asked to stop
// while its connection no longer carries anything (neither the consumer
// cancel nor the channel close is answered) still returns, within about
// twice DrainTimeout, after its in-flight delivery committed. The delivery,
// unacknowledged as far as the broker knows, comes back and is a duplicate.
func TestShutdownBoundedWhenTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := testenv.NewProxy(t, b.amqpURL)
	conn, err := broker.Dial(b.ctx, proxy.URL, broker.ConnConfig{Name: "frozen", Heartbeat: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { go func() { _ = conn.Close() }() }) // frozen: may never finish

	entered, release := make(chan struct{}), make(chan struct{})
	r := b.start(func(c *consumer.Config) {
		c.Conn, c.PublishConn = conn, conn
		c.Concurrency, c.BatchSize = 1, 1
		c.DrainTimeout = time.Second
		next := c.Handler
		c.Handler = func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
			if d.Envelope.MessageID == "held" {
				close(entered)
				<-release
			}
			return next(ctx, tx, d)
		}
	}, nil)
	b.send("held", doOK, nil)
	<-entered
	proxy.Freeze()
	r.cancel()
	close(release)
	select {
	case err := <-r.done:
		require.NoError(t, err)
		r.done <- nil // for the cleanup
	case <-time.After(testTimeout):
		t.Fatal("Run did not return while the broker was not answering")
	}
	require.Equal(t, []int{1}, b.effects("held"), "the in-flight delivery committed during the drain")

	// Once the dead path fails for good, the broker gives the delivery,
	// whose acknowledgement it never saw, to a consumer on a working
	// connection, and the inbox knows it.
	proxy.Cut()
	r2 := b.start(nil, nil)
	b.waitSettled("held", "duplicate")
	b.stop(r2)
	require.Equal(t, []int{1}, b.effects("held"))
}

// TestShutdownBoundedWhenAHandlerIgnoresItsContext: a handler that does not
// return when its context is cancelled does not hold Run: about
// DrainTimeout after the cancel, the consumer stops without it and logs
// its message id. The message, never acknowledged, is handled by the next
// consumer once the abandoned transaction has ended.
func TestShutdownBoundedWhenAHandlerIgnoresItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs testenv.LogBuffer
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := b.start(func(c *consumer.Config) {
		c.Concurrency, c.BatchSize = 1, 1
		c.DrainTimeout = 300 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		next := c.Handler
		c.Handler = func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
			first := false
			once.Do(func() { first = true })
			if first {
				close(entered)
				<-release // ignores ctx
			}
			return next(ctx, tx, d)
		}
	}, nil)
	b.send("stuck", doOK, nil)
	<-entered
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(t, err)
		r.done <- nil // for the cleanup
	case <-time.After(testTimeout):
		close(release)
		t.Fatal("Run waited for a handler that ignores its context")
	}
	require.Contains(t, logs.String(), `level=ERROR msg="handlers did not return after their context was cancelled`)
	require.Contains(t, logs.String(), "message_ids=[stuck]")

	close(release) // its transaction ends (its context is cancelled: nothing commits)
	r2 := b.start(nil, nil)
	b.waitSettled("stuck", "done")
	b.stop(r2)
	require.Equal(t, []int{1}, b.effects("stuck"))
}
