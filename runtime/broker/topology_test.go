package broker_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

func TestNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders.parking", broker.ParkingQueue("orders"))
	for ttl, want := range map[time.Duration]string{
		2 * time.Hour:           "orders.retry.2h",
		5 * time.Minute:         "orders.retry.5m",
		90 * time.Second:        "orders.retry.90s",
		1500 * time.Millisecond: "orders.retry.1500ms",
		250 * time.Millisecond:  "orders.retry.250ms",
	} {
		require.Equal(t, want, broker.TierQueue("orders", ttl))
	}
}

func TestWorkQueue(t *testing.T) {
	t.Parallel()
	p := retry.Policy{Tiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}, MaxAttempts: 3}
	got := broker.WorkQueue("orders", "", p)
	require.Equal(t, []broker.Queue{
		{Name: "orders", Type: broker.QueueQuorum, Args: amqp.Table{
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.parking",
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		}},
		{Name: "orders.retry.1s", Type: broker.QueueQuorum, Args: amqp.Table{
			"x-message-ttl": int64(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders",
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		}},
		{Name: "orders.retry.10s", Type: broker.QueueQuorum, Args: amqp.Table{
			"x-message-ttl": int64(10000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders",
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		}},
		{Name: "orders.parking", Type: broker.QueueQuorum},
	}, got, "MaxAttempts 3 waits twice: the one-minute tier is never used; the work queue parks what the broker gives up on")

	classic := broker.WorkQueue("q", broker.QueueClassic, retry.Policy{Tiers: []time.Duration{time.Second}, MaxAttempts: 9})
	require.Equal(t, []broker.Queue{
		{Name: "q", Type: broker.QueueClassic},
		{Name: "q.retry.1s", Type: broker.QueueClassic, Args: amqp.Table{"x-message-ttl": int64(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"}},
		{Name: "q.parking", Type: broker.QueueClassic},
	}, classic, "the last tier is reused, declared once")

	noRetry := broker.WorkQueue("q", broker.QueueClassic, retry.Policy{MaxAttempts: 1})
	require.Len(t, noRetry, 2)

	def := broker.WorkQueue("q", "", retry.Policy{})
	require.Len(t, def, 2+len(retry.Default().Tiers), "zero policy means the default")
}

func TestMergeAndValidate(t *testing.T) {
	t.Parallel()
	a := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop"}},
		Queues:    []broker.Queue{{Name: "orders"}},
		Bindings:  []broker.Binding{{Queue: "orders", Exchange: "shop", RoutingKey: "order.*"}},
	}
	b := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop"}, {Name: "events", Kind: "fanout"}},
		Queues:    []broker.Queue{{Name: "orders"}, {Name: "audit", Type: broker.QueueClassic}},
		Bindings:  []broker.Binding{{Queue: "orders", Exchange: "shop", RoutingKey: "order.*"}},
	}
	m := a.Merge(b)
	require.NoError(t, m.Validate())
	require.Len(t, m.Exchanges, 2)
	require.Len(t, m.Queues, 2)
	require.Len(t, m.Bindings, 1)
	require.Len(t, a.Exchanges, 1, "Merge does not modify its receiver")

	conflict := m.Merge(broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop", Kind: "direct"}},
		Queues:    []broker.Queue{{Name: "orders", Type: broker.QueueClassic}},
	})
	err := conflict.Validate()
	require.ErrorContains(t, err, `exchange "shop" defined twice`)
	require.ErrorContains(t, err, `queue "orders" defined twice`)

	bad := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "amq.topic"}, {Name: "x", Kind: "weird"}},
		Queues:    []broker.Queue{{Name: ""}, {Name: "q", Type: "stream-ish"}, {Name: "r", Args: amqp.Table{"f": struct{}{}}}},
		Bindings:  []broker.Binding{{Queue: "q", Exchange: ""}},
	}
	err = bad.Validate()
	for _, want := range []string{`exchange "amq.topic"`, `unknown kind "weird"`, `queue "": name`, `unknown type "stream-ish"`, `queue "r": arguments`, "default exchange cannot be bound"} {
		require.ErrorContains(t, err, want)
	}
	_, err = bad.DefinitionsJSON()
	require.Error(t, err)
}

func TestDefinitionsJSON(t *testing.T) {
	t.Parallel()
	top := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "shop"}, {Name: "audit", Kind: "fanout"}},
		Queues:    broker.WorkQueue("orders", "", retry.Policy{Tiers: []time.Duration{time.Second}, MaxAttempts: 2}),
		Bindings: []broker.Binding{
			{Queue: "orders", Exchange: "shop", RoutingKey: "order.placed"},
			{Queue: "orders", Exchange: "audit"},
			{Queue: "orders", Exchange: "shop", RoutingKey: "order.cancelled"},
		},
	}
	got, err := top.DefinitionsJSON()
	require.NoError(t, err)
	const want = `{
  "exchanges": [
    {
      "name": "audit",
      "type": "fanout",
      "durable": true,
      "auto_delete": false,
      "internal": false,
      "arguments": {}
    },
    {
      "name": "shop",
      "type": "topic",
      "durable": true,
      "auto_delete": false,
      "internal": false,
      "arguments": {}
    }
  ],
  "queues": [
    {
      "name": "orders",
      "durable": true,
      "auto_delete": false,
      "arguments": {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.parking",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-queue-type": "quorum"
      }
    },
    {
      "name": "orders.parking",
      "durable": true,
      "auto_delete": false,
      "arguments": {
        "x-queue-type": "quorum"
      }
    },
    {
      "name": "orders.retry.1s",
      "durable": true,
      "auto_delete": false,
      "arguments": {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders",
        "x-dead-letter-strategy": "at-least-once",
        "x-message-ttl": 1000,
        "x-overflow": "reject-publish",
        "x-queue-type": "quorum"
      }
    }
  ],
  "bindings": [
    {
      "source": "audit",
      "destination": "orders",
      "destination_type": "queue",
      "routing_key": "",
      "arguments": {}
    },
    {
      "source": "shop",
      "destination": "orders",
      "destination_type": "queue",
      "routing_key": "order.cancelled",
      "arguments": {}
    },
    {
      "source": "shop",
      "destination": "orders",
      "destination_type": "queue",
      "routing_key": "order.placed",
      "arguments": {}
    }
  ]
}
`
	require.Equal(t, want, string(got))

	// Order of declaration and duplicates do not change the output.
	shuffled := broker.Topology{
		Exchanges: []broker.Exchange{top.Exchanges[1], top.Exchanges[0], top.Exchanges[0]},
		Queues:    append([]broker.Queue{top.Queues[2], top.Queues[1], top.Queues[0]}, top.Queues...),
		Bindings:  []broker.Binding{top.Bindings[2], top.Bindings[1], top.Bindings[0]},
	}
	again, err := shuffled.DefinitionsJSON()
	require.NoError(t, err)
	require.Equal(t, want, string(again))
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "amqps://user:xxxxx@host:5671/vh", broker.Redact("amqps://user:s3cret@host:5671/vh"))
	require.Equal(t, "amqp://host/", broker.Redact("amqp://host/"))
	require.NotContains(t, broker.Redact("amqp://u:s3cret@host:bad port/"), "s3cret")
	require.Equal(t, "amqp://u:xxxxx@a:5672/,amqp://u:xxxxx@b:5672/", broker.Redact("amqp://u:s3cret@a:5672/, amqp://u:s3cret@b:5672/"))
}

func TestURLFromEnv(t *testing.T) {
	t.Setenv("SAGA_BROKER_TEST_URL", "amqps://u:s3cret@example.com/vh")
	got, err := broker.URLFromEnv("SAGA_BROKER_TEST_URL")
	require.NoError(t, err)
	require.Equal(t, "amqps://u:s3cret@example.com/vh", got)

	t.Setenv("SAGA_BROKER_TEST_URL", "http://u:s3cret@example.com/")
	_, err = broker.URLFromEnv("SAGA_BROKER_TEST_URL")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	t.Setenv("SAGA_BROKER_TEST_URL", "amqp://u:s3cret@a/,amqp://u:s3cret@b/")
	got, err = broker.URLFromEnv("SAGA_BROKER_TEST_URL")
	require.NoError(t, err, "a cluster's nodes")
	require.Equal(t, "amqp://u:s3cret@a/,amqp://u:s3cret@b/", got)
	t.Setenv("SAGA_BROKER_TEST_URL", "amqp://u:s3cret@a/,http://u:s3cret@b/")
	_, err = broker.URLFromEnv("SAGA_BROKER_TEST_URL")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	_, err = broker.URLFromEnv("SAGA_BROKER_TEST_UNSET")
	require.ErrorContains(t, err, "SAGA_BROKER_TEST_UNSET is empty or unset")
}

// TestPlan: a plan's topology is its exchanges and bindings with every
// work queue expanded by WorkQueue for the queue type and policy; Default
// uses quorum queues and retry.Default().
func TestPlan(t *testing.T) {
	t.Parallel()
	plan := broker.Plan{
		Exchanges:  []broker.Exchange{{Name: "shop.commands", Kind: "direct"}},
		WorkQueues: []string{"orders", "payments"},
		Bindings:   []broker.Binding{{Queue: "orders", Exchange: "shop.commands", RoutingKey: "command.order"}},
	}
	p := retry.Policy{Tiers: []time.Duration{time.Second}, MaxAttempts: 2}
	got := plan.Topology(broker.QueueClassic, p)
	require.Equal(t, plan.Exchanges, got.Exchanges)
	require.Equal(t, plan.Bindings, got.Bindings)
	want := append(broker.WorkQueue("orders", broker.QueueClassic, p), broker.WorkQueue("payments", broker.QueueClassic, p)...)
	require.Equal(t, want, got.Queues)
	require.NoError(t, got.Validate())
	require.Equal(t, plan.Topology(broker.QueueQuorum, retry.Default()), plan.Default())
}
