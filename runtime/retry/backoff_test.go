package retry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/retry"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	for attempt := range 20 {
		d := retry.Backoff(attempt, 100*time.Millisecond, 5*time.Second)
		ceiling := min(100*time.Millisecond<<attempt, 5*time.Second)
		require.GreaterOrEqual(t, d, ceiling/2, "attempt %d", attempt)
		require.LessOrEqual(t, d, ceiling, "attempt %d", attempt)
	}
}
