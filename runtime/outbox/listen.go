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
// holds the relay's liveness lock (see liveness.go). started runs once,
// after the first attempt to connect and lock, whether it succeeded or not.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}, started func()) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	defer started() // when ctx ended before the first attempt
	for attempt := 0; ctx.Err() == nil; attempt++ {
		conn, err := r.listenConn(ctx)
		if err == nil {
			r.lockLiveness(ctx, conn)
		}
		started()
		if err == nil {
			attempt = 0
			if r.cfg.onListen != nil {
				r.cfg.onListen()
			}
			signal()
			err = r.waitLoop(ctx, conn, signal)
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay: LISTEN connection failed; polling until it is back", "owner", r.cfg.Owner, "error", err)
		r.tel.metrics.ListenReconnected(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(broker.Backoff(attempt, 100*time.Millisecond, 10*time.Second)):
		}
	}
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
func (r *Relay) waitLoop(ctx context.Context, conn *pgx.Conn, signal func()) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenHealthInterval)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			signal()
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
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
