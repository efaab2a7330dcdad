package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/broker"
)

// TestSettleContext: a settle is bounded by LeaseDuration while the relay
// runs — not by any batch's lease context, which may be nearly spent for the
// oldest of the batches merged into one settle — by ConfirmTimeout more once
// the relay is stopped, and ends at once on a crash.
func TestSettleContext(t *testing.T) {
	t.Parallel()
	newPipeline := func(ctx context.Context, lease, confirm time.Duration) *pipeline {
		r := &Relay{cfg: RelayConfig{LeaseDuration: lease, ConfirmTimeout: confirm}}
		return &pipeline{r: r, ctx: ctx, crashed: make(chan struct{})}
	}
	ended := func(ctx context.Context, within time.Duration) bool {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(within):
			return false
		}
	}

	t.Run("LeaseDurationWhileRunning", func(t *testing.T) {
		t.Parallel()
		p := newPipeline(context.Background(), 300*time.Millisecond, 50*time.Millisecond)
		ctx, cancel := p.settleContext()
		defer cancel()
		if ended(ctx, 150*time.Millisecond) {
			t.Fatal("a running relay's settle ended before LeaseDuration")
		}
		if !ended(ctx, 2*time.Second) {
			t.Fatal("a settle outlived LeaseDuration")
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", ctx.Err())
		}
	})

	t.Run("ConfirmTimeoutAfterStop", func(t *testing.T) {
		t.Parallel()
		run, stop := context.WithCancel(context.Background())
		p := newPipeline(run, time.Minute, 100*time.Millisecond)
		ctx, cancel := p.settleContext()
		defer cancel()
		stop()
		if ended(ctx, 40*time.Millisecond) {
			t.Fatal("a settle ended with the relay's context instead of draining")
		}
		if !ended(ctx, 2*time.Second) {
			t.Fatal("a settle outlived the drain")
		}
	})

	t.Run("AtOnceOnCrash", func(t *testing.T) {
		t.Parallel()
		p := newPipeline(context.Background(), time.Minute, time.Minute)
		ctx, cancel := p.settleContext()
		defer cancel()
		close(p.crashed)
		if !ended(ctx, 2*time.Second) {
			t.Fatal("a settle survived a crash")
		}
	})
}

// A row failed by a connection-level error is retried at once twice, then
// backs off like a refused one: its own publish may be what closes the
// channel (a body over the broker's max_message_size). A row never written
// is retried at once however often it was claimed (a long broker outage).
func TestRetryDelay(t *testing.T) {
	lost := fmt.Errorf("%w: connection reset", broker.ErrChannelClosed)
	refused := fmt.Errorf("%w: correlation id too long", broker.ErrInvalidMessage)
	unsent := fmt.Errorf("%w: %w: publisher closed", broker.ErrNotSent, broker.ErrChannelClosed)
	for _, tt := range []struct {
		err      error
		attempts int32
		zero     bool
	}{
		{lost, 1, true}, {lost, 2, true}, {lost, 3, false}, {lost, 20, false},
		{unsent, 3, true}, {unsent, 20, true},
		{refused, 1, false}, {broker.ErrReturned, 1, false}, {broker.ErrNacked, 1, false}, {broker.ErrNoExchange, 1, false},
	} {
		d := retryDelay(tt.err, tt.attempts)
		if tt.zero {
			require.Zero(t, d, "%v after %d attempts", tt.err, tt.attempts)
			continue
		}
		require.Positive(t, d, "%v after %d attempts", tt.err, tt.attempts)
		require.LessOrEqual(t, d, 30*time.Second)
	}
}
