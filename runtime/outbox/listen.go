package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/retry"
)

// listenHealthInterval is how long the listener waits for a notification
// before it pings its connection, so a silently dead connection is found.
const listenHealthInterval = 15 * time.Second

// listen keeps a LISTEN connection open until ctx ends and signals wake on
// every notification. Every (re)connect signals wake too, since
// notifications sent while nobody listened are lost. The connection also
// holds the relay's liveness lock and keeps its registration (see
// liveness.go), tried again every poll while either is missing. When ctx
// ends with errStopped as its cause (a clean stop, once the relay's rows are
// finished), the registration is deleted before the lock goes with the
// connection. tried is closed once the first try for the lock has ended,
// taken or not.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}, tried chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	lock := &livenessState{}
	lost := false // a connection was lost and not re-established yet
	for attempt := 0; ctx.Err() == nil; attempt++ {
		conn, err := r.listenConn(ctx)
		if err == nil {
			if r.cfg.beforeLiveness != nil {
				r.cfg.beforeLiveness()
			}
			err = lock.check(ctx, r, conn, false)
		}
		if tried != nil {
			close(tried)
			tried = nil
		}
		if err == nil {
			attempt = 0
			if lost {
				// Counted once per loss, when it is made good: the
				// attempts that failed meanwhile are not reconnects.
				r.tel.metrics.ListenReconnected(ctx)
				lost = false
			}
			if r.cfg.onListen != nil {
				r.cfg.onListen()
			}
			signal()
			err = r.waitLoop(ctx, conn, signal, lock)
		}
		if conn != nil {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if lock.locked && errors.Is(context.Cause(ctx), errStopped) {
				if _, err := conn.Exec(stopCtx, unregisterSQL, r.cfg.Owner, lock.key); err != nil {
					r.cfg.Logger.Warn("outbox relay: could not delete its registration; other relays delete it once its lock is free",
						"owner", r.cfg.Owner, "error", err)
				}
			}
			_ = conn.Close(stopCtx)
			cancel()
		}
		lock.locked, lock.registered = false, false // they went with the session
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay: LISTEN connection failed; polling until it is back", "owner", r.cfg.Owner, "error", err)
		lost = true
		// At most a poll apart, so that the relay takes its liveness lock
		// again well within the grace other relays give it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry.Backoff(attempt, 100*time.Millisecond, min(10*time.Second, max(r.cfg.PollInterval, 100*time.Millisecond)))):
		}
	}
}

// errStopped is the cause the relay's listener is stopped with on a clean
// stop (see listen).
var errStopped = errors.New("outbox relay stopped")

// livenessState is the listener's view of the relay's liveness lock and
// registration.
type livenessState struct {
	key                   int64 // the lock key (lockKeySQL), once known
	haveKey               bool
	locked, registered    bool
	lockWarned, regWarned bool
	nextTry               time.Time // when to try again what is missing
}

func (l *livenessState) complete() bool { return l.locked && l.registered }

// check takes the lock if the relay does not hold it, and registers if it
// is not registered or force is set (the health check re-registers, so a
// row deleted meanwhile comes back). Another session holding the lock (a
// relay with the same Owner, this relay's previous session not yet ended,
// or another relay's look) is no error, nor is a registration the server
// refuses (migration 0006 not applied, say): both are tried again a poll
// later. An error means the connection failed.
func (l *livenessState) check(ctx context.Context, r *Relay, conn *pgx.Conn, force bool) error {
	l.nextTry = time.Now().Add(r.cfg.PollInterval)
	if !l.haveKey {
		if err := conn.QueryRow(ctx, lockKeySQL, livenessLockPrefix, r.cfg.Owner).Scan(&l.key); err != nil {
			return fmt.Errorf("compute the liveness lock key: %w", err)
		}
		l.haveKey = true
	}
	if !l.locked {
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&l.locked); err != nil {
			return fmt.Errorf("take the liveness lock: %w", err)
		}
		switch {
		case l.locked && l.lockWarned:
			r.cfg.Logger.Info("outbox relay: holds its liveness lock now", "owner", r.cfg.Owner)
			l.lockWarned = false
		case !l.locked && !l.lockWarned:
			r.cfg.Logger.Warn("outbox relay: another session holds this owner's liveness lock (a relay with the same Owner, this relay's previous connection, or another relay looking); trying every poll, and until then a crash leaves its rows for their lease",
				"owner", r.cfg.Owner, "lease", r.cfg.LeaseDuration)
			l.lockWarned = true
		}
		if !l.locked {
			return nil
		}
	}
	if l.registered && !force {
		return nil
	}
	_, err := conn.Exec(ctx, registerSQL, r.cfg.Owner, l.key, r.reapGrace().Milliseconds())
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		if !l.regWarned {
			r.cfg.Logger.Warn("outbox relay: could not register in saga_outbox_relays (are the runtime's migrations applied?); trying every poll, and until then a crash leaves its rows for their lease",
				"owner", r.cfg.Owner, "error", err)
			l.regWarned = true
		}
		l.registered = false
		return nil
	case err != nil:
		return fmt.Errorf("register in saga_outbox_relays: %w", err)
	}
	if l.regWarned {
		r.cfg.Logger.Info("outbox relay: registered in saga_outbox_relays now", "owner", r.cfg.Owner)
		l.regWarned = false
	}
	l.registered = true
	return nil
}

// listenConn takes a connection out of the pool (so it keeps the pool's
// settings, such as search_path) and LISTENs on it.
func (r *Relay) listenConn(ctx context.Context) (*pgx.Conn, error) {
	pc, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire LISTEN connection: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("LISTEN %s: %w", NotifyChannel, err)
	}
	return conn, nil
}

// waitLoop waits for notifications until ctx ends or the connection fails.
// It checks the connection every listenHealthInterval (and registers
// again), and while the liveness lock or registration is missing it tries
// again every poll, whether or not notifications arrive meanwhile.
func (r *Relay) waitLoop(ctx context.Context, conn *pgx.Conn, signal func(), lock *livenessState) error {
	nextHealth := time.Now().Add(listenHealthInterval)
	for {
		if !lock.complete() && !time.Now().Before(lock.nextTry) {
			if err := lock.check(ctx, r, conn, false); err != nil {
				return err
			}
		}
		if !time.Now().Before(nextHealth) {
			pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("ping LISTEN connection: %w", err)
			}
			if lock.locked {
				if err := lock.check(ctx, r, conn, true); err != nil {
					return err
				}
			}
			nextHealth = time.Now().Add(listenHealthInterval)
		}
		wait := time.Until(nextHealth)
		if !lock.complete() {
			wait = min(wait, time.Until(lock.nextTry))
		}
		waitCtx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			signal()
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// a check is due
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}
