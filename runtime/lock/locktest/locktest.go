// Package locktest is the conformance suite every lock.Backend passes: the
// PostgreSQL backend's and the Redis backend's tests run it against real
// servers, and a backend of a team's own can run it too.
package locktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/protosaga/saga/runtime/lock"
)

// NewLocker returns a Locker on the backend under test, with cfg, whose
// names do not collide with any other test's.
type NewLocker func(t *testing.T, cfg lock.Config) *lock.Locker

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, newLocker NewLocker) {
	t.Run("Contention", func(t *testing.T) { t.Parallel(); testContention(t, newLocker) })
	t.Run("TryHeldThenFree", func(t *testing.T) { t.Parallel(); testTryHeldThenFree(t, newLocker) })
	t.Run("OnlyOwnerReleases", func(t *testing.T) { t.Parallel(); testOnlyOwnerReleases(t, newLocker) })
	t.Run("ExpiryDuringPause", func(t *testing.T) { t.Parallel(); testExpiryDuringPause(t, newLocker) })
	t.Run("ExtendKeepsLease", func(t *testing.T) { t.Parallel(); testExtendKeepsLease(t, newLocker) })
	t.Run("AcquireWaitsForRelease", func(t *testing.T) { t.Parallel(); testAcquireWaits(t, newLocker) })
	t.Run("AcquireGivesUpWithContext", func(t *testing.T) { t.Parallel(); testAcquireCanceled(t, newLocker) })
}

func fastRetries() lock.Config {
	return lock.Config{RetryMin: time.Millisecond, RetryMax: 20 * time.Millisecond}
}

// testContention: workers take turns under one name; nobody is ever inside
// with another, and tokens grow in the order the leases were taken.
func testContention(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const workers, rounds = 6, 5
	var (
		inside  atomic.Int32
		overlap atomic.Bool
		mu      sync.Mutex
		tokens  []int64
		wg      sync.WaitGroup
		errs    = make(chan error, workers*rounds)
	)
	for range workers {
		wg.Go(func() {
			for range rounds {
				err := l.Do(ctx, "contended", 30*time.Second, func(ctx context.Context, lease *lock.Lease) error {
					if inside.Add(1) != 1 {
						overlap.Store(true)
					}
					mu.Lock()
					tokens = append(tokens, lease.Token)
					mu.Unlock()
					time.Sleep(time.Millisecond) // let the others try meanwhile
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Do: %v", err)
	}
	if overlap.Load() {
		t.Fatal("two workers held the lease at once")
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("%d critical sections ran, want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after token %d: tokens must grow in acquisition order (%v)", tokens[i], tokens[i-1], tokens)
		}
	}
}

func testTryHeldThenFree(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "res", time.Minute)
	if err != nil {
		t.Fatalf("first TryAcquire: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "res", time.Minute); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire of a held lease: got %v, want ErrHeld", err)
	}
	other, err := l.TryAcquire(ctx, "other-res", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire of another name: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if a.Valid() {
		t.Fatal("a released lease reports Valid")
	}
	b, err := l.TryAcquire(ctx, "res", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	if b.Token <= a.Token {
		t.Fatalf("token %d after a release of token %d: must grow", b.Token, a.Token)
	}
	if b.Owner == a.Owner {
		t.Fatalf("two leases share owner token %q", a.Owner)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("Release b: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatalf("Release other: %v", err)
	}
}

// testOnlyOwnerReleases: another owner can neither release nor extend a
// lease, even knowing its token.
func testOnlyOwnerReleases(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	b := l.Backend()
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "owned", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := b.Release(ctx, "owned", "intruder", a.Token); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("release by another owner: got %v, want ErrLost", err)
	}
	if err := b.Extend(ctx, "owned", "intruder", a.Token, time.Hour); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("extend by another owner: got %v, want ErrLost", err)
	}
	if _, err := l.TryAcquire(ctx, "owned", time.Minute); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("after another owner's release attempt the lease must still be held: got %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("owner's Release: %v", err)
	}
	if err := a.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("second Release: got %v, want ErrLost", err)
	}
}

// testExpiryDuringPause: the owner pauses past its lease, another owner
// takes it and writes; the paused owner's write is refused by the fence.
func testExpiryDuringPause(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var fence lock.Fence
	var written []string
	write := func(lease *lock.Lease, what string) error {
		return fence.Write("shared-file", lease.Token, func() error {
			written = append(written, what)
			return nil
		})
	}

	a, err := l.TryAcquire(ctx, "paused", 150*time.Millisecond)
	if err != nil {
		t.Fatalf("TryAcquire a: %v", err)
	}
	if err := write(a, "a1"); err != nil {
		t.Fatalf("a's write under its lease: %v", err)
	}
	// a pauses (a GC pause, a stalled VM): b waits for the lease and gets
	// it once it expired.
	b, err := l.Acquire(ctx, "paused", time.Minute)
	if err != nil {
		t.Fatalf("Acquire b: %v", err)
	}
	if b.Token <= a.Token {
		t.Fatalf("b's token %d is not above a's %d", b.Token, a.Token)
	}
	if a.Valid() {
		t.Fatal("a's lease reports Valid after b took the name")
	}
	if err := write(b, "b1"); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	// a wakes up and carries on as if it still held the lease.
	err = write(a, "a2")
	var stale *lock.StaleTokenError
	if !errors.As(err, &stale) || !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("a's write after the pause: got %v, want a StaleTokenError", err)
	}
	if stale.Token != a.Token || stale.Highest != b.Token || stale.Resource != "shared-file" {
		t.Fatalf("stale token error %+v, want token %d, highest %d", stale, a.Token, b.Token)
	}
	if fmt.Sprint(written) != "[a1 b1]" {
		t.Fatalf("written %v, want [a1 b1]", written)
	}
	if err := a.Extend(ctx, time.Minute); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("a's Extend after the pause: got %v, want ErrLost", err)
	}
	if err := a.Release(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("a's Release after the pause: got %v, want ErrLost", err)
	}
	if _, err := l.TryAcquire(ctx, "paused", time.Minute); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a's Release must leave b's lease alone: TryAcquire got %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b's Release: %v", err)
	}
}

// testExtendKeepsLease: an extended lease outlives its first lease time.
func testExtendKeepsLease(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "extended", 2*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := a.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	time.Sleep(2500 * time.Millisecond) // past the first lease time, well within the extension
	if _, err := l.TryAcquire(ctx, "extended", time.Minute); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire of an extended lease: got %v, want ErrHeld", err)
	}
	if !a.Valid() {
		t.Fatal("an extended lease reports not Valid")
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testAcquireWaits(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := l.TryAcquire(ctx, "waited", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	got := make(chan *lock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := l.Acquire(ctx, "waited", time.Minute)
		if err != nil {
			errc <- err
			return
		}
		got <- b
	}()
	select {
	case b := <-got:
		t.Fatalf("Acquire returned lease %d while a held the name", b.Token)
	case err := <-errc:
		t.Fatalf("Acquire: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case b := <-got:
		if b.Token <= a.Token {
			t.Fatalf("waiter's token %d is not above %d", b.Token, a.Token)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("waiter's Release: %v", err)
		}
	case err := <-errc:
		t.Fatalf("Acquire: %v", err)
	}
}

func testAcquireCanceled(t *testing.T, newLocker NewLocker) {
	l := newLocker(t, fastRetries())
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "busy", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = l.Acquire(wctx, "busy", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("Acquire of a held name until the deadline: got %v, want DeadlineExceeded and ErrHeld", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
