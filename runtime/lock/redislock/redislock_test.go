package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/lock/locktest"
	"github.com/protosaga/saga/runtime/lock/redislock"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	locktest.Run(t, func(t *testing.T, cfg lock.Config) *lock.Locker {
		c, prefix := testenv.Redis(t)
		l, err := redislock.NewLocker(c, redislock.Options{Prefix: prefix}, cfg)
		require.NoError(t, err)
		return l
	})
}

// TestKeys: the lease holds the owner token and expires; the counter does
// not expire; both share a hash slot.
func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, prefix := testenv.Redis(t)
	l, err := redislock.NewLocker(c, redislock.Options{Prefix: prefix}, lock.Config{})
	require.NoError(t, err)
	a, err := l.TryAcquire(ctx, "printer/1", time.Minute)
	require.NoError(t, err)
	owner, err := c.Get(ctx, prefix+"{printer/1}").Result()
	require.NoError(t, err)
	require.Equal(t, a.Owner, owner)
	ttl, err := c.PTTL(ctx, prefix+"{printer/1}").Result()
	require.NoError(t, err)
	require.Positive(t, ttl)
	counter, err := c.Get(ctx, prefix+"{printer/1}:fence").Int64()
	require.NoError(t, err)
	require.Equal(t, a.Token, counter)
	ttl, err = c.PTTL(ctx, prefix+"{printer/1}:fence").Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "the fencing counter never expires")
	require.NoError(t, a.Release(ctx))
	require.Zero(t, c.Exists(ctx, prefix+"{printer/1}").Val())
}

func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// do retries op across the reconnection that follows a restart.
func do(t *testing.T, op func() error) error {
	t.Helper()
	var err error
	for range 100 {
		if err = op(); err == nil || errorsIsLockErr(err) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

func errorsIsLockErr(err error) bool {
	return errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrHeld)
}

// TestRestartWithoutPersistence: a Redis that restarts without its data
// forgets every lease. Another owner takes the name at once, while the
// first still believes it holds it; the fencing token still grows (the
// counter is raised to the server clock), so the resource refuses the
// first owner's writes, and the first owner's Extend and Release report
// ErrLost.
func TestRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivateRedis(t, false)
	l, err := redislock.NewLocker(client(t, srv.URL), redislock.Options{}, lock.Config{})
	require.NoError(t, err)
	var fence lock.Fence
	a, err := l.TryAcquire(ctx, "manifest", time.Hour)
	require.NoError(t, err)
	require.NoError(t, fence.Admit("manifest", a.Token))

	srv.Restart()

	var b *lock.Lease
	require.NoError(t, do(t, func() (err error) { b, err = l.TryAcquire(ctx, "manifest", time.Hour); return err }),
		"the restarted server forgot a's lease")
	require.Greater(t, b.Token, a.Token, "tokens grow across a restart that lost the counter")
	require.NoError(t, fence.Admit("manifest", b.Token))
	require.ErrorIs(t, fence.Admit("manifest", a.Token), lock.ErrStaleToken)
	require.ErrorIs(t, do(t, func() error { return a.Extend(ctx, time.Hour) }), lock.ErrLost)
	require.ErrorIs(t, a.Release(ctx), lock.ErrLost)
	require.NoError(t, b.Release(ctx))
}

// TestRestartWithPersistence: with the append-only file fsynced on every
// write, a restart keeps the lease and its expiry: nobody else takes the
// name, and the owner extends and releases it.
func TestRestartWithPersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.PrivateRedis(t, true)
	l, err := redislock.NewLocker(client(t, srv.URL), redislock.Options{}, lock.Config{})
	require.NoError(t, err)
	a, err := l.TryAcquire(ctx, "manifest", time.Hour)
	require.NoError(t, err)

	srv.Restart()

	require.ErrorIs(t, do(t, func() error { _, err := l.TryAcquire(ctx, "manifest", time.Hour); return err }), lock.ErrHeld)
	require.NoError(t, do(t, func() error { return a.Extend(ctx, time.Hour) }))
	require.NoError(t, a.Release(ctx))
	b, err := l.TryAcquire(ctx, "manifest", time.Hour)
	require.NoError(t, err)
	require.Greater(t, b.Token, a.Token)
	require.NoError(t, b.Release(ctx))
}
