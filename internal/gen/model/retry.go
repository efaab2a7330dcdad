package model

import (
	"strings"
	"time"

	"github.com/protosaga/saga/runtime/retry"
)

// RetryPolicy returns the retry policy the review assumes for every work
// queue: the one the generated Topology function declares tier queues for
// (retry.Default()). The contract cannot declare another; a host that
// configures its own (host.Config.Retry) is not seen by the review.
func RetryPolicy() retry.Policy { return retry.Default() }

// RetryDelay returns how long after its first delivery p may deliver a
// message again: the sum of the waits before every further delivery
// (1s + 10s + 1m + 1m = 2m11s for retry.Default()).
func RetryDelay(p retry.Policy) time.Duration {
	var sum time.Duration
	for attempt := 1; ; attempt++ {
		d, ok := p.TierFor(attempt)
		if !ok {
			return sum
		}
		sum = saturatingAdd(sum, d)
	}
}

// tierList prints the waits of p in order ("1s, 10s, 1m0s, 1m0s").
func tierList(p retry.Policy) string {
	var waits []string
	for attempt := 1; ; attempt++ {
		d, ok := p.TierFor(attempt)
		if !ok {
			return strings.Join(waits, ", ")
		}
		waits = append(waits, d.String())
	}
}
