package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

type testBundle struct {
	url  string
	conn *broker.Conn
	ch   *amqp.Channel
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	u := testenv.AMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := broker.Dial(ctx, u, broker.ConnConfig{Name: t.Name(), MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	return &testBundle{url: u, conn: conn, ch: ch}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// get waits for the next message on queue.
func get(t *testing.T, ctx context.Context, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if ok {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no message on %s: %v", queue, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func msg(id string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)}
}

func TestDeclareIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop"}},
		Queues:    broker.WorkQueue("orders", "", retry.Policy{Tiers: []time.Duration{time.Second, 5 * time.Second}, MaxAttempts: 3}),
		Bindings:  []broker.Binding{{Queue: "orders", Exchange: "shop", RoutingKey: "order.#"}},
	}
	require.NoError(t, broker.Declare(ctx, b.ch, top))
	require.NoError(t, broker.Declare(ctx, b.ch, top))

	for _, q := range top.Queues {
		_, err := b.ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
		require.NoError(t, err, q.Name)
	}
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
	require.Equal(t, []error{nil}, p.Publish(ctx, []broker.Outgoing{{Exchange: "shop", RoutingKey: "order.placed", Publishing: msg("m1")}}))
	require.Equal(t, "m1", get(t, ctx, b.ch, "orders").MessageId)

	// The same name with another type is refused by the broker, naming the queue.
	err := broker.Declare(ctx, b.ch, broker.Topology{Queues: []broker.Queue{{Name: "orders", Type: broker.QueueClassic}}})
	require.ErrorContains(t, err, `declare queue "orders"`)
	require.ErrorContains(t, err, "PRECONDITION_FAILED")
}

func TestTierQueueDeadLettersBack(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	for _, qt := range []broker.QueueType{broker.QueueQuorum, broker.QueueClassic} {
		work := "work-" + string(qt)
		queues := broker.WorkQueue(work, qt, retry.Policy{Tiers: []time.Duration{200 * time.Millisecond}, MaxAttempts: 2})
		require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{Queues: queues}))

		// A consumer retries by publishing into the tier through the default exchange.
		tier := broker.TierQueue(work, 200*time.Millisecond)
		p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
		require.Equal(t, []error{nil}, p.Publish(ctx, []broker.Outgoing{{RoutingKey: tier, Publishing: msg("retry-me-" + string(qt))}}))

		d := get(t, ctx, b.ch, work)
		require.Equal(t, "retry-me-"+string(qt), d.MessageId)
		deaths, ok := d.Headers["x-death"].([]any)
		require.True(t, ok, "dead-lettered by the broker, not by us: %v", d.Headers)
		require.Equal(t, tier, deaths[0].(amqp.Table)["queue"])
		require.Equal(t, "expired", deaths[0].(amqp.Table)["reason"])
	}
}

func TestConnReconnects(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	_, err := b.ch.QueueDeclare("survivor", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	closed := b.ch.NotifyClose(make(chan *amqp.Error, 1))

	testenv.KillAMQPConnectionsUntil(t, b.url, closed)

	// Channel waits for the new connection and works on it.
	ch, err := b.conn.Channel(ctx)
	require.NoError(t, err)
	_, err = ch.QueueDeclarePassive("survivor", true, false, false, false, nil)
	require.NoError(t, err)

	// And again: the supervisor keeps watching the new connection.
	closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	testenv.KillAMQPConnectionsUntil(t, b.url, closed)
	ch, err = b.conn.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	require.NoError(t, b.conn.Close())
	_, err = b.conn.Channel(ctx)
	require.ErrorIs(t, err, broker.ErrClosed)
}

// TestConnMovesToAnotherNode: with a list of nodes, Dial passes over one
// that does not answer, and a lost connection is replaced by one to another
// node while the first stays dead. The nodes are proxies to one broker.
func TestConnMovesToAnotherNode(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	u := testenv.AMQP(t)
	a, b := testenv.NewProxy(t, u), testenv.NewProxy(t, u)
	conn, err := broker.Dial(ctx, a.URL+","+b.URL, broker.ConnConfig{Name: t.Name(), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	require.Equal(t, 1, a.Carried(), "the first node first")
	require.Zero(t, b.Carried())
	require.NotContains(t, conn.String(), "guest:guest", "every URL redacted")

	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	a.Down()
	<-closed
	ch, err = conn.Channel(ctx)
	require.NoError(t, err, "a channel on the other node")
	_, err = ch.QueueDeclare("moved", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	require.Equal(t, 1, b.Carried())

	// A dead node first in the list is passed over.
	first, err := broker.Dial(ctx, "amqp://guest:guest@127.0.0.1:1/,"+b.URL, broker.ConnConfig{MinBackoff: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, first.Close())
	require.Equal(t, 2, b.Carried())
}

func TestDialFailures(t *testing.T) {
	t.Parallel()
	u := testenv.AMQP(t)
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	parsed.User = url.UserPassword(parsed.User.Username(), "wrong-s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = broker.Dial(ctx, parsed.String(), broker.ConnConfig{})
	require.ErrorIs(t, err, amqp.ErrCredentials, "refused credentials fail at once, without waiting for ctx")
	require.NotContains(t, err.Error(), "wrong-s3cret")
	require.NoError(t, ctx.Err())

	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = broker.Dial(short, "amqp://u:s3cret@127.0.0.1:1/", broker.ConnConfig{MinBackoff: 10 * time.Millisecond})
	require.ErrorIs(t, err, context.DeadlineExceeded, "unreachable brokers are retried until ctx ends")
	require.NotContains(t, err.Error(), "s3cret")
}

func declareRouted(t *testing.T, ctx context.Context, ch *amqp.Channel, args amqp.Table) {
	t.Helper()
	q := broker.Queue{Name: "routed", Type: broker.QueueClassic, Args: args}
	require.NoError(t, broker.Declare(ctx, ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: "ex"}},
		Queues:    []broker.Queue{q},
		Bindings:  []broker.Binding{{Queue: "routed", Exchange: "ex", RoutingKey: "routed"}},
	}))
}

func TestPublisherReturnsAndConfirms(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)

	p := broker.NewPublisher(b.conn, broker.PublisherConfig{Window: 8})
	var out []broker.Outgoing
	for i := range 100 {
		key := "routed"
		if i%7 == 3 {
			key = "nobody-listens"
		}
		out = append(out, broker.Outgoing{Exchange: "ex", RoutingKey: key, Publishing: msg(fmt.Sprint(i))})
	}
	out = append(out, broker.Outgoing{Exchange: "ex", RoutingKey: "routed", Publishing: amqp.Publishing{}})
	errs := p.Publish(ctx, out)
	require.Len(t, errs, len(out))
	routed := 0
	for i, err := range errs[:100] {
		if i%7 == 3 {
			require.ErrorIs(t, err, broker.ErrReturned, "message %d", i)
			require.ErrorContains(t, err, "NO_ROUTE")
		} else {
			require.NoError(t, err, "message %d", i)
			routed++
		}
	}
	require.ErrorContains(t, errs[100], "message id required")
	for range routed {
		d := get(t, ctx, b.ch, "routed")
		require.NotEqual(t, "3", d.MessageId)
	}
}

func TestPublisherNacks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	// A full queue that rejects publishes makes the broker nack.
	declareRouted(t, ctx, b.ch, amqp.Table{"x-max-length": int64(2), "x-overflow": "reject-publish"})

	p := broker.NewPublisher(b.conn, broker.PublisherConfig{Window: 4})
	errs := p.Publish(ctx, []broker.Outgoing{
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("a")},
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("b")},
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("c")},
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], broker.ErrNacked)

	// Nacks do not poison the channel: after draining, publishing works.
	get(t, ctx, b.ch, "routed")
	require.Equal(t, []error{nil}, p.Publish(ctx, []broker.Outgoing{{Exchange: "ex", RoutingKey: "routed", Publishing: msg("d")}}))
}

func TestPublisherMissingExchange(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)
	require.NoError(t, b.ch.ExchangeDeclare("doomed", "topic", true, false, false, false, nil))
	require.NoError(t, b.ch.QueueBind("routed", "#", "doomed", false, nil))

	// A missing exchange fails only its own messages: the channel survives.
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
	errs := p.Publish(ctx, []broker.Outgoing{
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("before")},
		{Exchange: "no-such-exchange", RoutingKey: "x", Publishing: msg("lost")},
		{Exchange: "doomed", RoutingKey: "x", Publishing: msg("doomed-1")},
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("after")},
	})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], broker.ErrNoExchange)
	require.NoError(t, errs[2])
	require.NoError(t, errs[3])

	// An exchange deleted after it was checked closes the channel (the
	// broker's NOT_FOUND); the next call checks again and fails only it.
	require.NoError(t, b.ch.ExchangeDelete("doomed", false, false))
	errs = p.Publish(ctx, []broker.Outgoing{{Exchange: "doomed", RoutingKey: "x", Publishing: msg("doomed-2")}})
	require.ErrorIs(t, errs[0], broker.ErrChannelClosed)
	require.ErrorContains(t, errs[0], "NOT_FOUND")
	errs = p.Publish(ctx, []broker.Outgoing{
		{Exchange: "doomed", RoutingKey: "x", Publishing: msg("doomed-3")},
		{Exchange: "ex", RoutingKey: "routed", Publishing: msg("next")},
	})
	require.ErrorIs(t, errs[0], broker.ErrNoExchange)
	require.NoError(t, errs[1])
}

func TestPublisherSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	declareRouted(t, ctx, b.ch, nil)
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{Window: 16})

	// Publish batches back to back while the connection is killed (the
	// management API takes a few seconds to see it), so the kill lands
	// inside a batch. Whatever failed is published again until nothing is.
	// A kill that lands between two batches fails nothing (the next batch
	// goes out on the new connection); then the connection is killed again.
	var pending []broker.Outgoing
	next, failures := 0, 0
	publish := func() {
		errs := p.Publish(ctx, pending)
		var again []broker.Outgoing
		for i, err := range errs {
			if err != nil {
				failures++
				again = append(again, pending[i])
			}
		}
		pending = again
	}
	for kills := 1; failures == 0; kills++ {
		require.LessOrEqual(t, kills, 3, "no kill of the connection failed a publish")
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			testenv.KillAMQPConnections(t, b.url)
		}()
		for running := true; running; {
			select {
			case <-killed:
				running = false
			default:
			}
			for range 200 {
				pending = append(pending, broker.Outgoing{Exchange: "ex", RoutingKey: "routed", Publishing: msg(fmt.Sprint(next))})
				next++
			}
			publish()
		}
		for round := 0; len(pending) > 0; round++ {
			require.Less(t, round, 50)
			publish()
		}
	}
	t.Logf("%d messages, %d publishes failed and were repeated", next, failures)

	ch, err := b.conn.Channel(ctx)
	require.NoError(t, err)
	deliveries, err := ch.Consume("routed", "", true, false, false, false, nil)
	require.NoError(t, err)
	seen := map[string]bool{}
	for len(seen) < next {
		select {
		case d := <-deliveries:
			seen[d.MessageId] = true
		case <-ctx.Done():
			t.Fatalf("only %d of %d messages arrived", len(seen), next)
		}
	}
}

func TestDefinitionsImport(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	api := os.Getenv(testenv.EnvRabbitAPI)
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop"}},
		Queues:    broker.WorkQueue("orders", "", retry.Default()),
		Bindings:  []broker.Binding{{Queue: "orders", Exchange: "shop", RoutingKey: "order.#"}},
	}
	defs, err := top.DefinitionsJSON()
	require.NoError(t, err)

	vhost, err := testenv.VHost(b.url)
	require.NoError(t, err)
	base, err := url.Parse(api)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		base.Scheme+"://"+base.Host+strings.TrimSuffix(base.Path, "/")+"/definitions/"+url.PathEscape(vhost), bytes.NewReader(defs))
	require.NoError(t, err)
	pw, _ := base.User.Password()
	req.SetBasicAuth(base.User.Username(), pw)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Less(t, resp.StatusCode, 300, resp.Status)

	// What the import created is exactly what Declare declares: declaring
	// on top of it is accepted (any argument difference would be refused).
	require.NoError(t, broker.Declare(ctx, b.ch, top))
}

// TestChannelGivesUpWhenTheBrokerStopsAnswering: a broker that stops
// reading the connection never answers a channel open; Channel returns when
// its context ends instead of waiting for it.
func TestChannelGivesUpWhenTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	proxy := testenv.NewProxy(t, testenv.AMQP(t))
	conn, err := broker.Dial(ctx, proxy.URL, broker.ConnConfig{Name: t.Name(), Heartbeat: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { go func() { _ = conn.Close() }() }) // frozen: may never finish
	ch, err := conn.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	proxy.Freeze()
	opened := make(chan error, 1)
	go func() {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := conn.Channel(short)
		opened <- err
	}()
	select {
	case err := <-opened:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-ctx.Done():
		t.Fatal("Channel waited for a broker that does not answer, past its context")
	}
}
