package consumer_test

import (
	"context"
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
