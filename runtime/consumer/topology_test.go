package consumer_test

import (
	"context"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/rabbitapi"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
)

// TestMisdeclaredTierIsRefusedAtStart: a tier queue that exists under the
// right name but does not send its messages back to the work queue after its
// delay (declared by hand without dead-lettering, with another TTL, or
// dead-lettering elsewhere) would lose or misroute every retry, silently.
// The consumer refuses to start, naming the queue; tiers declared by
// broker.WorkQueue, quorum or classic, are accepted.
func TestMisdeclaredTierIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ch, err := b.conn.Channel(b.ctx)
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()

	var runOn func(conn *broker.Conn, queue string) error
	run := func(queue string) error { return runOn(b.conn, queue) }
	runOn = func(conn *broker.Conn, queue string) error {
		t.Helper()
		c, err := consumer.New(consumer.Config{
			Name: "x-" + queue, Queue: queue, Pool: b.pool, Conn: conn, Registry: b.reg, Handler: b.handle,
			Retry: b.policy, Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		// A consumer that starts runs until this context ends, and then
		// returns nil.
		ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
		defer cancel()
		return c.Run(ctx)
	}
	declare := func(queues ...broker.Queue) {
		t.Helper()
		require.NoError(t, broker.Declare(b.ctx, ch, broker.Topology{Queues: queues}))
	}
	tier := func(queue string, i int) broker.Queue {
		return broker.WorkQueue(queue, broker.QueueQuorum, b.policy)[1+i]
	}

	cases := map[string]func(q broker.Queue, work string) broker.Queue{
		"no-dead-letter": func(q broker.Queue, _ string) broker.Queue {
			return broker.Queue{Name: q.Name, Args: amqp.Table{broker.ArgMessageTTL: q.Args[broker.ArgMessageTTL]}}
		},
		"other-ttl": func(q broker.Queue, _ string) broker.Queue {
			q.Args = cloneTable(q.Args)
			q.Args[broker.ArgMessageTTL] = int64(60_000)
			return q
		},
		"dead-letters-elsewhere": func(q broker.Queue, _ string) broker.Queue {
			q.Args = cloneTable(q.Args)
			q.Args[broker.ArgDeadLetterRoutingKey] = "somewhere-else"
			return q
		},
	}
	for name, bad := range cases {
		work := "misdeclared-" + name
		queues := broker.WorkQueue(work, broker.QueueQuorum, b.policy)
		queues[2] = bad(tier(work, 1), work)
		declare(queues...)
		err := run(work)
		require.Error(t, err, "%s: the consumer started on a tier that does not return its messages", name)
		require.ErrorContains(t, err, queues[2].Name, name)
		t.Logf("%s: %v", name, err)
	}

	// A tier whose other arguments differ still refuses when its TTL does
	// (RabbitMQ names the TTL first).
	work := "misdeclared-lazy-other-ttl"
	queues := broker.WorkQueue(work, broker.QueueClassic, b.policy)
	queues[2].Args = cloneTable(queues[2].Args)
	queues[2].Args["x-queue-mode"] = "lazy"
	queues[2].Args[broker.ArgMessageTTL] = int64(60_000)
	declare(queues...)
	require.ErrorContains(t, run(work), broker.ArgMessageTTL)

	// Correct tiers of either type are accepted, and so are tiers that
	// delay and dead-letter as WorkQueue declares them but carry other
	// arguments too: their retries return.
	for _, qt := range []broker.QueueType{broker.QueueQuorum, broker.QueueClassic} {
		work := "declared-" + string(qt)
		declare(broker.WorkQueue(work, qt, b.policy)...)
		require.NoError(t, run(work), qt)
	}
	extra := map[string]struct {
		qt   broker.QueueType
		args amqp.Table
	}{
		"lazy":           {broker.QueueClassic, amqp.Table{"x-queue-mode": "lazy"}},
		"max-length":     {broker.QueueClassic, amqp.Table{"x-max-length": int64(1_000_000)}},
		"group-size":     {broker.QueueQuorum, amqp.Table{"x-quorum-initial-group-size": int64(1)}},
		"delivery-limit": {broker.QueueQuorum, amqp.Table{"x-delivery-limit": int64(50)}},
	}
	for name, e := range extra {
		work := "extra-" + name
		queues := broker.WorkQueue(work, e.qt, b.policy)
		for i := 1; i < len(queues)-1; i++ {
			queues[i].Args = cloneTable(queues[i].Args)
			maps.Copy(queues[i].Args, e.args)
		}
		declare(queues...)
		require.NoError(t, run(work), name)
	}

	// A user who may not declare queues cannot check the arguments: the
	// consumer says so and starts.
	user := restrictedUser(t, b.amqpURL)
	conn, err := broker.Dial(b.ctx, user, broker.ConnConfig{Name: "restricted"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	queue := "declared-" + string(broker.QueueQuorum)
	c, err := consumer.New(consumer.Config{
		Name: "restricted", Queue: queue, Pool: b.pool, Conn: conn, Registry: b.reg, Handler: b.handle,
		Retry: b.policy, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	env := b.envelopeFor("to-restricted", doOK)
	b.publish(broker.Outgoing{RoutingKey: queue, Publishing: env.Publishing()})
	require.Eventually(t, func() bool { return len(b.callsOf("to-restricted")) > 0 }, testTimeout, poll, "the restricted consumer never consumed")
	cancel()
	require.NoError(t, <-done)
}

// restrictedUser creates a user who may read and write everything on the
// vhost of amqpURL but configure (declare) nothing, and returns amqpURL for
// it.
func restrictedUser(t *testing.T, amqpURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := os.Getenv(testenv.EnvRabbitAPI)
	vhost, err := testenv.VHost(amqpURL)
	require.NoError(t, err)
	name := "restricted-" + vhost
	require.NoError(t, rabbitapi.Call(ctx, api, http.MethodPut, "/users/"+url.PathEscape(name),
		map[string]string{"password": "pw", "tags": ""}, nil))
	t.Cleanup(func() {
		_ = rabbitapi.Call(context.Background(), api, http.MethodDelete, "/users/"+url.PathEscape(name), nil, nil)
	})
	require.NoError(t, rabbitapi.Call(ctx, api, http.MethodPut, "/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(name),
		map[string]string{"configure": "^$", "write": ".*", "read": ".*"}, nil))
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, "pw")
	return u.String()
}

func cloneTable(t amqp.Table) amqp.Table {
	c := amqp.Table{}
	for k, v := range t {
		c[k] = v
	}
	return c
}

// TestUnboundedAttemptsStart: a policy that retries (almost) for ever
// through its last tier — MaxAttempts math.MaxInt — needs no more queues
// than the tiers, and the consumer starts on them.
func TestUnboundedAttemptsStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.policy.MaxAttempts = math.MaxInt
	r := b.start(nil, nil)
	b.send("forever", doTransientOnce, nil)
	b.waitSettled("forever", "done")
	b.stop(r)
	require.Equal(t, []int{1, 2}, b.attemptsOf("forever"))
}
