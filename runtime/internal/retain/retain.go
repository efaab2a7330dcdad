// Package retain runs the runtime's periodic deletion of rows that are only
// kept for a while: published outbox rows (the relay) and inbox claims
// (each consumer).
package retain

import (
	"context"
	"log/slog"
	"time"
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
	// Interval is the time between two prunes; the first runs one
	// Interval after Run starts.
	Interval time.Duration
	// Now is the clock the cut is taken from.
	Now func() time.Time
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

// Run prunes every Interval until ctx ends. A failed prune is logged and
// tried again at the next tick.
func (j Job) Run(ctx context.Context) {
	if j.Keep < 0 {
		return
	}
	t := time.NewTicker(j.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cut := j.Now().Add(-j.Keep)
		n, err := j.Prune(ctx, cut)
		if j.Pruned != nil {
			j.Pruned(n)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			j.Logger.Warn("pruning "+j.What+" failed; trying again at the next interval",
				"older_than", cut, "deleted", n, "interval", j.Interval, "error", err)
		case n > 0:
			j.Logger.Info("pruned "+j.What, "older_than", cut, "deleted", n)
		}
	}
}
