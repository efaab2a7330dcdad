package broker_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/rabbitapi"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

// brokerMajor returns the major version the broker at amqpURL announces.
func brokerMajor(t *testing.T, amqpURL string) int {
	t.Helper()
	c, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer c.Close()
	v, _ := c.Properties["version"].(string)
	major, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	require.NoError(t, err, "server version %q", v)
	return major
}

// nackUntilParked takes the one message of queue and hands it back
// (nack, requeue) until the broker dead-letters it into queue's parking lot,
// and returns how often it was delivered and the parked message.
func nackUntilParked(t *testing.T, ctx context.Context, ch *amqp.Channel, queue string) (int, amqp.Delivery) {
	t.Helper()
	n := 0
	for {
		d, ok, err := ch.Get(queue, false)
		require.NoError(t, err)
		if ok {
			n++
			require.NoError(t, d.Nack(false, true))
			continue
		}
		p, ok, err := ch.Get(broker.ParkingQueue(queue), true)
		require.NoError(t, err)
		if ok {
			return n, p
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: after %d deliveries the message is neither in the queue nor parked: %v", queue, n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestWorkQueueParksPastDeliveryLimit: a message handed back more often than
// a quorum work queue's delivery limit lands in its parking lot, with the
// broker's x-death, instead of being dropped. On RabbitMQ 4 the limit is the
// broker's default (20); 3.x has no default, so the queue sets 20 itself.
func TestWorkQueueParksPastDeliveryLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	queues := broker.WorkQueue("limited", broker.QueueQuorum, retry.Policy{Tiers: []time.Duration{time.Second}, MaxAttempts: 2})
	const limit = 20
	if brokerMajor(t, b.url) < 4 {
		queues[0].Args = maps.Clone(queues[0].Args)
		queues[0].Args["x-delivery-limit"] = int64(limit)
	}
	require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{Queues: queues}))
	p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
	require.Equal(t, []error{nil}, p.Publish(ctx, []broker.Outgoing{{RoutingKey: "limited", Publishing: msg("poison-1")}}))

	n, parked := nackUntilParked(t, ctx, b.ch, "limited")
	require.Equal(t, "poison-1", parked.MessageId)
	require.GreaterOrEqual(t, n, limit, "parked only after the delivery limit")
	require.LessOrEqual(t, n, limit+1)
	deaths, ok := parked.Headers["x-death"].([]any)
	require.True(t, ok, "dead-lettered by the broker: %v", parked.Headers)
	require.Equal(t, "limited", deaths[0].(amqp.Table)["queue"])
	require.Equal(t, "delivery_limit", deaths[0].(amqp.Table)["reason"])
}

// TestLegacyWorkQueueUpgrade: a quorum work queue declared without
// dead-lettering (by an older runtime) makes Declare fail with
// PRECONDITION_FAILED; LegacyWorkQueue recognizes it and gives the topology
// that declares, and the policy LegacyWorkQueuePolicy defines parks what the
// delivery limit gives up on, without redeclaring the queue.
func TestLegacyWorkQueueUpgrade(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	top := broker.Topology{Queues: broker.WorkQueue("old", broker.QueueQuorum, retry.Policy{Tiers: []time.Duration{time.Second}, MaxAttempts: 2})}
	old := broker.Topology{Queues: append([]broker.Queue{{Name: "old", Type: broker.QueueQuorum}}, top.Queues[1:]...)}
	require.NoError(t, broker.Declare(ctx, b.ch, old))

	ch, err := b.conn.Channel(ctx)
	require.NoError(t, err)
	err = broker.Declare(ctx, ch, top)
	require.ErrorContains(t, err, "PRECONDITION_FAILED")
	legacy, queue, ok := broker.LegacyWorkQueue(top, err)
	require.True(t, ok, "recognized: %v", err)
	require.Equal(t, "old", queue)
	require.Equal(t, old, legacy)
	ch, err = b.conn.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, ch, legacy))

	_, _, ok = broker.LegacyWorkQueue(top, &amqp.Error{Code: amqp.PreconditionFailed,
		Reason: "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'old.retry.1s' in vhost 'v'"})
	require.False(t, ok, "another argument is not an upgrade")

	// The policy, with a small delivery limit of its own (one policy applies
	// to a queue; on 3.x there is no default limit).
	var def map[string]any
	require.NoError(t, json.Unmarshal([]byte(broker.LegacyWorkQueuePolicy("old")), &def))
	def["delivery-limit"] = 3
	vhost, err := testenv.VHost(b.url)
	require.NoError(t, err)
	require.NoError(t, rabbitapi.Call(ctx, os.Getenv(testenv.EnvRabbitAPI), http.MethodPut,
		"/policies/"+url.PathEscape(vhost)+"/saga-park-old",
		map[string]any{"pattern": "^old$", "apply-to": "queues", "definition": def}, nil))

	p := broker.NewPublisher(b.conn, broker.PublisherConfig{})
	require.Equal(t, []error{nil}, p.Publish(ctx, []broker.Outgoing{{RoutingKey: "old", Publishing: msg("poison-2")}}))
	n, parked := nackUntilParked(t, ctx, b.ch, "old")
	require.Equal(t, "poison-2", parked.MessageId)
	require.GreaterOrEqual(t, n, 3)
	deaths, ok := parked.Headers["x-death"].([]any)
	require.True(t, ok, "dead-lettered by the broker: %v", parked.Headers)
	require.Equal(t, "delivery_limit", deaths[0].(amqp.Table)["reason"])
}
