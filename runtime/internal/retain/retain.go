// Package retain runs the runtime's periodic deletion of rows that are only
// kept for a while: published outbox rows (the relay) and inbox claims
// (each consumer).
package retain

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the retention settings: outbox.RelayConfig.KeepPublished,
// consumer.Config.KeepClaims and both PruneIntervals.
const (
	DefaultKeepPublished = 7 * 24 * time.Hour
	DefaultKeepClaims    = 30 * 24 * time.Hour
	DefaultInterval      = time.Minute
)

// Job is one kind of periodic pruning.
type Job struct {
	// What names the rows in logs, e.g. "published outbox rows".
	What string
	// Keep is how long rows are kept; negative disables the job.
	Keep time.Duration
	// Interval is the time between two prunes; the first runs when Run
	// starts, so a process that restarts often still prunes.
	Interval time.Duration
	// Clock reads the clock the cut is taken from: the database's (see
	// DatabaseClock), which wrote the rows' times, so that a host whose
	// clock is ahead does not delete rows early.
	Clock func(ctx context.Context) (time.Time, error)
	// Prune deletes the rows older than the cut and says how many it
	// deleted, also when it fails part way.
	Prune func(ctx context.Context, olderThan time.Time) (int64, error)
	// Pruned, when set, is told how many rows each prune deleted.
	Pruned func(n int64)
	// Logger receives a line per prune that deleted rows (Info) and per
	// failed prune (Warn).
	Logger *slog.Logger
}

// Start runs j in a goroutine until ctx ends or stop is called; stop
// returns once the goroutine has.
func (j Job) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// Run prunes at once and then every Interval until ctx ends. A failed
// prune is logged and tried again at the next tick.
func (j Job) Run(ctx context.Context) {
	if j.Keep < 0 {
		return
	}
	t := time.NewTicker(j.Interval)
	defer t.Stop()
	for {
		j.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once prunes the rows older than the clock's now - Keep.
func (j Job) once(ctx context.Context) {
	var (
		cut time.Time
		n   int64
	)
	now, err := j.Clock(ctx)
	if err == nil {
		cut = now.Add(-j.Keep)
		n, err = j.Prune(ctx, cut)
		if j.Pruned != nil {
			j.Pruned(n)
		}
	} else {
		err = fmt.Errorf("read the database clock: %w", err)
	}
	switch {
	case err != nil && ctx.Err() == nil && cut.IsZero():
		j.Logger.Warn("pruning "+j.What+" failed; trying again at the next interval",
			"interval", j.Interval, "error", err)
	case err != nil && ctx.Err() == nil:
		j.Logger.Warn("pruning "+j.What+" failed; trying again at the next interval",
			"older_than", cut, "deleted", n, "interval", j.Interval, "error", err)
	case n > 0:
		j.Logger.Info("pruned "+j.What, "older_than", cut, "deleted", n)
	}
}

// DatabaseClock reads now() from pool's database.
func DatabaseClock(pool *pgxpool.Pool) func(ctx context.Context) (time.Time, error) {
	return func(ctx context.Context) (now time.Time, err error) {
		err = pool.QueryRow(ctx, "SELECT now()").Scan(&now)
		return now, err
	}
}

// Batches runs sql with olderThan, batch and extra as its arguments ($1,
// $2, $3...) until a statement deletes fewer than batch rows, and returns
// how many it deleted in all; what names the work in its error, which
// reports the count deleted before it.
func Batches(ctx context.Context, pool *pgxpool.Pool, what, sql string, olderThan time.Time, batch int, extra ...any) (int64, error) {
	args := append([]any{olderThan, batch}, extra...)
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, args...)
		if err != nil {
			return total, fmt.Errorf("%s: %w", what, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
