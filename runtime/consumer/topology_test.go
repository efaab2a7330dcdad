package consumer_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

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
