package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/lock/locktest"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry"
)

// migrated returns a pool on a fresh, migrated schema.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(context.Background(), pool))
	return pool
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	locktest.Run(t, func(t *testing.T, cfg lock.Config) *lock.Locker {
		l, err := lock.NewPostgres(migrated(t), cfg)
		require.NoError(t, err)
		return l
	})
}

// TestPostgresConnectionLoss: every connection of the pool is terminated
// while a lease is held and while another process waits for it; the owner
// still extends and releases it, and the waiter gets it.
func TestPostgresConnectionLoss(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := migrated(t)
	l, err := lock.NewPostgres(pool, lock.Config{RetryMin: time.Millisecond, RetryMax: 20 * time.Millisecond})
	require.NoError(t, err)

	a, err := l.TryAcquire(ctx, "printer", time.Minute)
	require.NoError(t, err)
	waiter := make(chan *lock.Lease, 1)
	waitErr := make(chan error, 1)
	go func() {
		b, err := l.Acquire(ctx, "printer", time.Minute)
		if err != nil {
			waitErr <- err
			return
		}
		waiter <- b
	}()
	require.Positive(t, testenv.KillPostgresConnections(t, pool))

	// A statement on a killed connection fails (the pool then drops that
	// connection): the owner retries a failure that is not ErrLost, as any
	// caller would, until the pool has dialed a new one.
	retry := func(op func() error) error {
		var err error
		for range 50 {
			if err = op(); err == nil || errors.Is(err, lock.ErrLost) {
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
		return err
	}
	require.NoError(t, retry(func() error { return a.Extend(ctx, time.Minute) }))
	select {
	case b := <-waiter:
		t.Fatalf("the waiter got token %d while the owner held the lease", b.Token)
	case err := <-waitErr:
		t.Fatalf("the waiter failed: %v", err)
	default:
	}
	require.NoError(t, retry(func() error { return a.Release(ctx) }))
	select {
	case b := <-waiter:
		require.Greater(t, b.Token, a.Token)
		require.NoError(t, b.Release(ctx))
	case err := <-waitErr:
		t.Fatalf("the waiter failed: %v", err)
	}
}

// TestPostgresRetryAfterLostReply: an acquisition whose reply was lost
// (the row is the owner's) is taken back by the same owner's next attempt
// with a higher token, instead of waiting out its own lease.
func TestPostgresRetryAfterLostReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := lock.Postgres(migrated(t))
	first, err := b.TryAcquire(ctx, "n", "owner-1", time.Minute)
	require.NoError(t, err)
	again, err := b.TryAcquire(ctx, "n", "owner-1", time.Minute)
	require.NoError(t, err)
	require.Greater(t, again, first)
	_, err = b.TryAcquire(ctx, "n", "owner-2", time.Minute)
	require.ErrorIs(t, err, lock.ErrHeld)
	require.ErrorIs(t, b.Release(ctx, "n", "owner-1", first), lock.ErrLost, "the superseded token releases nothing")
	require.NoError(t, b.Release(ctx, "n", "owner-1", again))
}

// TestPostgresReleaseAfterExpiry: a release after the lease expired (nobody
// took it) frees it but reports ErrLost; tokens keep growing.
func TestPostgresReleaseAfterExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migrated(t)
	l, err := lock.NewPostgres(pool, lock.Config{})
	require.NoError(t, err)
	a, err := l.TryAcquire(ctx, "short", 50*time.Millisecond)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE saga_locks SET expires_at = clock_timestamp() - interval '1 second' WHERE name = 'short'`)
	require.NoError(t, err)
	require.ErrorIs(t, a.Release(ctx), lock.ErrLost)
	b, err := l.TryAcquire(ctx, "short", time.Minute)
	require.NoError(t, err)
	require.Greater(t, b.Token, a.Token)
	var owner string
	require.NoError(t, pool.QueryRow(ctx, `SELECT owner FROM saga_locks WHERE name = 'short'`).Scan(&owner))
	require.Equal(t, b.Owner, owner)
}

func TestFenceTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migrated(t)
	fenceOf := func(resource string, token int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return lock.FenceTx(ctx, tx, resource, token) })
	}
	fence := func(token int64) error { return fenceOf("manifest/ups", token) }
	require.NoError(t, fence(5))
	require.NoError(t, fence(5), "the holder of token 5 writes again")
	require.NoError(t, fence(7))
	err := fence(6)
	var stale *lock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.ErrorIs(t, err, lock.ErrStaleToken)
	require.Equal(t, lock.StaleTokenError{Resource: "manifest/ups", Token: 6, Highest: 7}, *stale)
	require.NoError(t, fence(1<<40), "higher tokens pass")
	require.NoError(t, fenceOf("manifest/fedex", 1), "other resources have fences of their own")

	// The check holds the fence row: a newer writer waits for the older
	// writer's transaction, and the older one's write lands first.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	require.NoError(t, lock.FenceTx(ctx, tx, "manifest/dhl", 10))
	done := make(chan error, 1)
	go func() { done <- fenceOf("manifest/dhl", 11) }()
	testenv.WaitBlocked(t, pool, "%saga_fences%")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
}

func TestFenceInMemory(t *testing.T) {
	t.Parallel()
	var f lock.Fence
	require.NoError(t, f.Admit("r", 3))
	require.NoError(t, f.Admit("r", 3))
	require.ErrorIs(t, f.Admit("r", 2), lock.ErrStaleToken)
	require.Equal(t, int64(3), f.Highest("r"))
	ran := false
	err := f.Write("r", 1, func() error { ran = true; return nil })
	require.ErrorIs(t, err, lock.ErrStaleToken)
	require.False(t, ran, "a refused write must not run")
	require.NoError(t, f.Write("other", 1, func() error { ran = true; return nil }))
	require.True(t, ran)
}

func TestSemanticLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migrated(t)
	inTx := func(fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) }

	require.NoError(t, inTx(func(tx pgx.Tx) error { return lock.MarkPendingTx(ctx, tx, "order/1", "saga-a", "awaiting payment") }))
	require.NoError(t, inTx(func(tx pgx.Tx) error { return lock.MarkPendingTx(ctx, tx, "order/1", "saga-a", "redelivered") }),
		"the same saga marks again (a redelivered command)")

	err := inTx(func(tx pgx.Tx) error { return lock.MarkPendingTx(ctx, tx, "order/1", "saga-b", "cancel") })
	var pending *lock.PendingError
	require.ErrorAs(t, err, &pending)
	require.ErrorIs(t, err, lock.ErrPending)
	require.Equal(t, "saga-a", pending.SagaID)
	require.Equal(t, "redelivered", pending.Reason)
	require.Contains(t, err.Error(), "order/1 is pending in saga saga-a")

	require.NoError(t, inTx(func(tx pgx.Tx) error { return lock.CheckPendingTx(ctx, tx, "order/1", "saga-a") }))
	require.ErrorIs(t, inTx(func(tx pgx.Tx) error { return lock.CheckPendingTx(ctx, tx, "order/1", "") }), lock.ErrPending)
	require.NoError(t, inTx(func(tx pgx.Tx) error { return lock.CheckPendingTx(ctx, tx, "order/2", "saga-b") }))

	var cleared bool
	require.NoError(t, inTx(func(tx pgx.Tx) (err error) {
		cleared, err = lock.ClearPendingTx(ctx, tx, "order/1", "saga-b")
		return err
	}))
	require.False(t, cleared, "another saga's clear leaves the mark")
	require.NoError(t, inTx(func(tx pgx.Tx) (err error) {
		cleared, err = lock.ClearPendingTx(ctx, tx, "order/1", "saga-a")
		return err
	}))
	require.True(t, cleared)
	require.NoError(t, inTx(func(tx pgx.Tx) error { return lock.MarkPendingTx(ctx, tx, "order/1", "saga-b", "cancel") }),
		"once settled, another saga marks the record")

	// A mark rolled back with its transaction is no mark.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	require.NoError(t, lock.MarkPendingTx(ctx, tx, "order/3", "saga-c", ""))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, inTx(func(tx pgx.Tx) error {
		_, ok, err := lock.PendingTx(ctx, tx, "order/3")
		require.False(t, ok)
		return err
	}))
}

// TestSemanticLockConcurrentMarkers: a second saga marking a record whose
// mark is not committed yet waits for that transaction: it gets the
// record when the first rolls back, and a PendingError when it commits.
func TestSemanticLockConcurrentMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migrated(t)
	markLater := func(resource, sagaID string) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return lock.MarkPendingTx(ctx, tx, resource, sagaID, "") })
		}()
		return done
	}
	for _, commit := range []bool{false, true} {
		resource := fmt.Sprintf("order/commit=%t", commit)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		require.NoError(t, lock.MarkPendingTx(ctx, tx, resource, "saga-first", ""))
		done := markLater(resource, "saga-second")
		testenv.WaitBlocked(t, pool, "%saga_pending%")
		if commit {
			require.NoError(t, tx.Commit(ctx))
			require.ErrorIs(t, <-done, lock.ErrPending, "the first saga committed its mark")
		} else {
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, <-done, "the first saga's mark rolled back")
		}
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	l, err := lock.NewPostgres(migrated(t), lock.Config{Telemetry: telemetry.Providers{Meter: provider}})
	require.NoError(t, err)
	a, err := l.TryAcquire(ctx, "m", time.Minute)
	require.NoError(t, err)
	_, err = l.TryAcquire(ctx, "m", time.Minute)
	require.ErrorIs(t, err, lock.ErrHeld)
	require.NoError(t, a.Release(ctx))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				backend, _ := dp.Attributes.Value(telemetry.KeyLockBackend)
				outcome, _ := dp.Attributes.Value(telemetry.KeyLockOutcome)
				counts[m.Name+" "+backend.AsString()+" "+outcome.AsString()] += dp.Count
			}
		}
	}
	require.Equal(t, map[string]uint64{
		"saga.lock.wait postgres acquired": 1,
		"saga.lock.wait postgres held":     1,
		"saga.lock.hold postgres released": 1,
	}, counts)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := lock.New(lock.Postgres(nil), lock.Config{RetryMin: time.Second, RetryMax: time.Millisecond})
	require.ErrorContains(t, err, "RetryMin 1s above RetryMax 1ms")
	l, err := lock.New(lock.Postgres(nil), lock.Config{})
	require.NoError(t, err)
	_, err = l.TryAcquire(context.Background(), "", 0)
	require.ErrorContains(t, err, "empty lock name")
	_, err = l.Acquire(context.Background(), "x", time.Microsecond)
	require.ErrorContains(t, err, "below 1ms")
}
