package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

// TestPlanRetryPerQueue: a queue with a declared policy gets that policy's
// tier queues whatever policy Topology is given; the others get the given
// one.
func TestPlanRetryPerQueue(t *testing.T) {
	t.Parallel()
	declared := retry.Policy{Tiers: []time.Duration{200 * time.Millisecond, 2 * time.Second}, MaxAttempts: 4}
	pl := broker.Plan{
		WorkQueues: []string{"a.commands", "b.commands"},
		Retry:      map[string]retry.Policy{"a.commands": declared},
	}
	host := retry.Policy{Tiers: []time.Duration{5 * time.Second}, MaxAttempts: 2}
	var names []string
	for _, q := range pl.Topology(broker.QueueQuorum, host).Queues {
		names = append(names, q.Name)
	}
	require.Subset(t, names, []string{"a.commands", "a.commands.retry.200ms", "a.commands.retry.2s", "b.commands", "b.commands.retry.5s"})
	require.NotContains(t, names, "a.commands.retry.5s")
	require.NotContains(t, names, "b.commands.retry.200ms")
	require.Equal(t, declared, pl.RetryFor("a.commands", host))
	require.Equal(t, host, pl.RetryFor("b.commands", host))
}
