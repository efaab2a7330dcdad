package retain

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/protosaga/saga/internal/testenv"
)

// TestJob: Run prunes at once and at each tick with the cut Clock()-Keep
// and counts what was deleted; a failed prune, or a clock that cannot be
// read, is logged and tried again at the next tick; a negative Keep never
// prunes; Run returns when its context ends.
func TestJob(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	t.Run("PrunesEachTickAndSurvivesFailures", func(t *testing.T) {
		t.Parallel()
		var (
			mu     sync.Mutex
			cuts   []time.Time
			pruned int64
			logs   testenv.LogBuffer
		)
		calls := make(chan int, 16)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		j := Job{
			What: "test rows", Keep: time.Hour, Interval: time.Millisecond,
			Clock: func(context.Context) (time.Time, error) { return now, nil },
			Prune: func(_ context.Context, olderThan time.Time) (int64, error) {
				mu.Lock()
				defer mu.Unlock()
				cuts = append(cuts, olderThan)
				n := len(cuts)
				select {
				case calls <- n:
				default: // the test has seen enough
				}
				if n == 1 {
					return 2, errors.New("database gone")
				}
				return 5, nil
			},
			Pruned: func(n int64) { mu.Lock(); pruned += n; mu.Unlock() },
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		}
		done := make(chan struct{})
		go func() { defer close(done); j.Run(ctx) }()
		for n := range calls {
			if n == 2 {
				break
			}
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cuts {
			if !c.Equal(now.Add(-time.Hour)) {
				t.Fatalf("cut %v, want %v", c, now.Add(-time.Hour))
			}
		}
		if pruned < 7 {
			t.Fatalf("pruned %d, want at least 2+5 (the failed prune's rows count too)", pruned)
		}
		out := logs.String()
		for _, want := range []string{"level=WARN msg=\"pruning test rows failed", "error=\"database gone\"", "level=INFO msg=\"pruned test rows\"", "deleted=5"} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("NoClockNoPrune", func(t *testing.T) {
		t.Parallel()
		var logs bytes.Buffer
		Job{What: "test rows", Keep: time.Hour, Interval: time.Hour,
			Clock: func(context.Context) (time.Time, error) { return time.Time{}, errors.New("connection refused") },
			Prune: func(context.Context, time.Time) (int64, error) {
				t.Error("pruned without reading the clock")
				return 0, nil
			},
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		}.once(context.Background())
		if !strings.Contains(logs.String(), `level=WARN msg="pruning test rows failed; trying again at the next interval"`) ||
			!strings.Contains(logs.String(), "read the database clock: connection refused") {
			t.Fatalf("log:\n%s", logs.String())
		}
	})

	t.Run("NegativeKeepNeverPrunes", func(t *testing.T) {
		t.Parallel()
		j := Job{Keep: -1, Interval: time.Millisecond,
			Clock: func(context.Context) (time.Time, error) { return time.Now(), nil },
			Prune: func(context.Context, time.Time) (int64, error) {
				t.Error("pruned with a negative Keep")
				return 0, nil
			}}
		done := make(chan struct{})
		go func() { defer close(done); j.Run(context.Background()) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run with a negative Keep did not return at once")
		}
	})
}

// TestBatches deletes in statements of at most batch rows until one deletes
// fewer: 2,500 old rows go in three statements of 1,000, the new rows stay;
// a failing statement names the work and reports what went before it.
func TestBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE rows (id int PRIMARY KEY, at timestamptz NOT NULL);
INSERT INTO rows SELECT i, CASE WHEN i <= 2500 THEN now() - interval '2 hours' ELSE now() END FROM generate_series(1, 2600) i`); err != nil {
		t.Fatal(err)
	}
	const sql = `DELETE FROM rows WHERE id = ANY(ARRAY(SELECT id FROM rows WHERE at < $1 AND id > $3 ORDER BY id LIMIT $2))`
	n, err := Batches(ctx, pool, "prune test rows", sql, time.Now().Add(-time.Hour), 1000, 0)
	if err != nil || n != 2500 {
		t.Fatalf("Batches = %d, %v; want 2500, nil", n, err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM rows`).Scan(&left); err != nil || left != 100 {
		t.Fatalf("%d rows left (%v), want the 100 new ones", left, err)
	}
	_, err = Batches(ctx, pool, "prune test rows", `DELETE FROM nowhere WHERE at < $1 LIMIT $2`, time.Now(), 10)
	if err == nil || !strings.HasPrefix(err.Error(), "prune test rows: ") {
		t.Fatalf("error %v, want it to start with the work's name", err)
	}
}
