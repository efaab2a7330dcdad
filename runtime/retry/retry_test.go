package retry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/retry"
)

func TestDefault(t *testing.T) {
	t.Parallel()

	p := retry.Default()
	require.NoError(t, p.Validate())
	require.False(t, p.IsZero())
	require.True(t, retry.Policy{}.IsZero())
	require.Equal(t, 5, p.MaxAttempts)

	// Default returns a fresh slice: changing one copy never changes another.
	p.Tiers[0] = time.Hour
	require.Equal(t, time.Second, retry.Default().Tiers[0])
}

func TestTierFor(t *testing.T) {
	t.Parallel()

	p := retry.Policy{Tiers: []time.Duration{100 * time.Millisecond, time.Second}, MaxAttempts: 4}
	tests := []struct {
		attempt int
		want    time.Duration
		ok      bool
	}{
		{0, 0, false},
		{-1, 0, false},
		{1, 100 * time.Millisecond, true},
		{2, time.Second, true},
		{3, time.Second, true}, // last tier reused
		{4, 0, false},          // fourth delivery was the last
		{5, 0, false},
	}
	for _, tt := range tests {
		got, ok := p.TierFor(tt.attempt)
		require.Equal(t, tt.ok, ok, "attempt %d", tt.attempt)
		require.Equal(t, tt.want, got, "attempt %d", tt.attempt)
	}

	noRetry := retry.Policy{MaxAttempts: 1}
	require.NoError(t, noRetry.Validate())
	_, ok := noRetry.TierFor(1)
	require.False(t, ok)
}

func TestValidate(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		p       retry.Policy
		wantErr string
	}{
		{"zero attempts", retry.Policy{Tiers: []time.Duration{time.Second}}, "MaxAttempts is 0"},
		{"retries without tiers", retry.Policy{MaxAttempts: 3}, "needs at least one tier"},
		{"negative tier", retry.Policy{Tiers: []time.Duration{-time.Second}, MaxAttempts: 2}, "positive"},
		{"sub-millisecond tier", retry.Policy{Tiers: []time.Duration{1500 * time.Microsecond}, MaxAttempts: 2}, "whole milliseconds"},
		{"not increasing", retry.Policy{Tiers: []time.Duration{time.Second, time.Second}, MaxAttempts: 3}, "not longer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, tt.p.Validate(), tt.wantErr)
		})
	}
}
