package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestRowsOfAGoneRelayWaitForNoLease: a relay that died with rows claimed
// (here after publishing them, before marking them) leaves them leased for
// an hour, yet another relay publishes them within a few polls, because no
// session holds the dead relay's liveness lock any more. Rows leased to a
// registered relay whose session still holds its lock are left alone until
// that session ends, and rows of an owner that never registered (a relay
// that could not take its lock) wait for their lease.
func TestRowsOfAGoneRelayWaitForNoLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	lockedBy := func(owner string) bool {
		t.Helper()
		var free bool
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, lockKey(t, b.pool, owner)).Scan(&free))
		return !free
	}

	ids := enqueue(t, ctx, b.pool, 20, routedKey)
	errCrash := errors.New("simulated crash")
	_, res := startRelay(t, b, RelayConfig{Owner: "doomed", LeaseDuration: time.Hour,
		// A slow listener: the first claim still waits for the lock.
		beforeLiveness: func() { time.Sleep(300 * time.Millisecond) },
		afterPublish: func([]int64) error {
			if !lockedBy("doomed") {
				return errors.New("the running relay does not hold its liveness lock")
			}
			return errCrash
		}})
	awaitCrash(t, ctx, res, errCrash)
	waitUnpublished(t, ctx, b.pool, 20) // published, not marked, leased for an hour
	require.Eventually(t, func() bool { return !lockedBy("doomed") }, 10*time.Second, 10*time.Millisecond,
		"the crashed relay's session ends (the server notices its connection close)")

	// A relay that is alive: a session holds its lock.
	alive := enqueue(t, ctx, b.pool, 5, routedKey)
	pc, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	holder := pc.Hijack() // out of the pool, which waits for it when the test ends
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	key := lockKey(t, b.pool, "alive")
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, registerSQL, "alive", key, 150)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'alive', lease_until = now() + interval '1 hour', attempts = 1
WHERE id IN (SELECT id FROM saga_outbox WHERE message_id = ANY($1))`, alive)
	require.NoError(t, err)

	// An owner that never registered.
	stranger := enqueue(t, ctx, b.pool, 3, routedKey)
	_, err = b.pool.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'stranger', lease_until = now() + interval '1 hour', attempts = 1
WHERE id IN (SELECT id FROM saga_outbox WHERE message_id = ANY($1))`, stranger)
	require.NoError(t, err)
	registered := func(owner string) bool {
		t.Helper()
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_relays WHERE owner = $1`, owner).Scan(&n))
		return n == 1
	}
	require.True(t, registered("doomed"), "a crashed relay leaves its registration")

	mp := metrictest.New(t)
	survivor, _ := startRelay(t, b, RelayConfig{Owner: "survivor", LeaseDuration: time.Hour, Telemetry: telemetry.Providers{Meter: mp}})
	goneRows := func() int64 { return mp.Sum(t, telemetry.MetricGoneRelayRows) }
	waitUnpublished(t, ctx, b.pool, len(alive)+len(stranger))
	require.False(t, registered("doomed"), "the gone relay's registration is deleted with its rows released")
	require.EqualValues(t, len(ids), goneRows(), "the released rows are counted")
	requireEach(t, drain(t, b), ids, 2) // once by the doomed relay, once by the survivor
	// Its session loses the lock for moments at a time, as a relay whose
	// LISTEN connection is re-established quickly: shorter than the grace
	// (three polls), so the relay is not taken for dead.
	for range 10 {
		_, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key)
		require.NoError(t, err)
		time.Sleep(30 * time.Millisecond)
		_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
	}
	var leasedToAlive int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state
WHERE published_at IS NULL AND lease_owner = 'alive' AND message_id = ANY($1)`, alive).Scan(&leasedToAlive))
	require.Equal(t, len(alive), leasedToAlive, "the rows of a relay that holds its lock are its own")
	require.True(t, lockedBy("survivor"), "a running relay holds its liveness lock")
	require.True(t, registered("survivor"), "and is registered")

	// Its session ends as its process dies: the rows go to the survivor.
	require.NoError(t, holder.Close(ctx))
	waitUnpublished(t, ctx, b.pool, len(stranger))
	requireEach(t, drain(t, b), alive, 1)
	require.EqualValues(t, len(ids)+len(alive), survivor.Stats().Published)
	require.EqualValues(t, len(ids)+len(alive), goneRows())
	var leasedToStranger int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state
WHERE published_at IS NULL AND lease_owner = 'stranger' AND lease_until > now()`).Scan(&leasedToStranger))
	require.Equal(t, len(stranger), leasedToStranger, "an owner that never registered keeps its lease")
}

// TestRelayRegistersWhileRunning: a relay whose lock another session holds
// runs unregistered and takes the lock within polls once it is free (while
// notifications keep arriving); a running relay is registered and holds its
// lock; a clean stop deletes its registration and lets go of the lock.
func TestRelayRegistersWhileRunning(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	pc, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	holder := pc.Hijack()
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	var key int64
	require.NoError(t, holder.QueryRow(ctx, lockKeySQL, livenessLockPrefix, "registered").Scan(&key))
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
	require.NoError(t, err)

	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, Owner: "registered", PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- r.Run(runCtx) }()
	registered := func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_relays WHERE owner = 'registered'`).Scan(&n))
		return n == 1
	}
	// Notifications every few milliseconds: the retry must not wait for a
	// quiet poll.
	for range 20 {
		enqueue(t, ctx, b.pool, 1, routedKey)
		time.Sleep(15 * time.Millisecond)
	}
	require.False(t, registered(), "not registered while another session holds its lock")
	require.NoError(t, holder.Close(ctx))
	stopNotes := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopNotes:
				return
			case <-time.After(15 * time.Millisecond):
				_, _ = b.pool.Exec(ctx, `SELECT pg_notify('`+NotifyChannel+`', '')`)
			}
		}
	}()
	require.Eventually(t, registered, 10*time.Second, 10*time.Millisecond, "takes its lock once it is free")
	close(stopNotes)
	var free bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(lock_key) FROM saga_outbox_relays WHERE owner = 'registered'`).Scan(&free))
	require.False(t, free, "the running relay holds its lock")
	cancel()
	require.NoError(t, <-res)
	require.False(t, registered(), "a clean stop deletes the registration")
}

// lockKey is the liveness lock key of owner's relay in pool's schema, as the
// relay computes it.
func lockKey(t *testing.T, pool *pgxpool.Pool, owner string) int64 {
	t.Helper()
	var key int64
	require.NoError(t, pool.QueryRow(t.Context(), lockKeySQL, livenessLockPrefix, owner).Scan(&key))
	return key
}
