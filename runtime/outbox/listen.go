package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/broker"
)

// listenHealthInterval is how long the listener waits for a notification
// before it pings its connection, so a silently dead connection is found.
const listenHealthInterval = 15 * time.Second

// listen keeps a LISTEN connection open until ctx ends and signals wake on
// every notification. Every (re)connect signals wake too, since
// notifications sent while nobody listened are lost. The connection also
// holds the relay's liveness lock (see liveness.go), tried again every poll
// while another session holds it.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	var lock livenessState
	for attempt := 0; ctx.Err() == nil; attempt++ {
		conn, err := r.listenConn(ctx)
		if err == nil {
			err = lock.try(ctx, r, conn)
		}
		if err == nil {
			attempt = 0
			if r.cfg.onListen != nil {
				r.cfg.onListen()
			}
			signal()
			err = r.waitLoop(ctx, conn, signal, &lock)
		}
		if conn != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		lock.held = false // it went with the session
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay: LISTEN connection failed; polling until it is back", "owner", r.cfg.Owner, "error", err)
		r.tel.metrics.ListenReconnected(ctx)
		// At most a poll apart, so that the relay takes its liveness lock
		// again well within the grace other relays give it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(broker.Backoff(attempt, 100*time.Millisecond, min(10*time.Second, max(r.cfg.PollInterval, 100*time.Millisecond)))):
		}
	}
}

// livenessState is whether the relay holds its liveness lock, and whether
// it said it does not.
type livenessState struct{ held, warned bool }

// try takes the lock on conn unless it is held already, and logs a change.
// An error means the connection failed.
func (l *livenessState) try(ctx context.Context, r *Relay, conn *pgx.Conn) error {
	if l.held {
		return nil
	}
	held, err := r.lockLiveness(ctx, conn)
	if err != nil {
		return err
	}
	switch {
	case held && l.warned:
		r.cfg.Logger.Info("outbox relay: holds its liveness lock again", "owner", r.cfg.Owner)
		l.warned = false
	case !held && !l.warned:
		r.cfg.Logger.Warn("outbox relay: another session holds this owner's liveness lock (a relay with the same Owner, or this relay's previous connection); trying every poll, and until then a crash leaves its rows for their lease",
			"owner", r.cfg.Owner, "lease", r.cfg.LeaseDuration)
		l.warned = true
	}
	l.held = held
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
// While the relay does not hold its liveness lock it wakes every poll to
// try again.
func (r *Relay) waitLoop(ctx context.Context, conn *pgx.Conn, signal func(), lock *livenessState) error {
	for {
		wait := listenHealthInterval
		if !lock.held {
			wait = r.cfg.PollInterval
		}
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			signal()
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			if !lock.held {
				if err := lock.try(ctx, r, conn); err != nil {
					return err
				}
				continue
			}
			pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pingCtx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping LISTEN connection: %w", err)
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}
