package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/internal/testenv"
)

// FailoverLoss is what one MeasureFailover run saw.
type FailoverLoss struct {
	// Acknowledged is how many commits returned success to a writer.
	Acknowledged int
	// Missing is how many of those the promoted replica does not have:
	// transactions the clients were told were committed, lost.
	Missing int
	// Lag is the replica's replay lag behind the primary the last time it
	// was sampled before the crash (pg_stat_replication.replay_lag), and
	// Outage the longest time no writer committed (the crash, the
	// promotion and the writers' reconnection).
	Lag, Outage time.Duration
}

// MeasureFailover measures what a failover loses: writers commits small
// transactions as fast as they can, each recording its id once the commit
// returned, for the given duration; then the primary crashes and the
// replica is promoted (Services.Failover), and the writers go on through the
// multi-host URL until they commit on the new primary. The ids the
// writers were told were committed and the new primary lacks are lost.
// With a synchronous replica none may be; an asynchronous one loses what it
// had not received when the primary died. svc must be replicated
// (testenv.StartReplicated).
func MeasureFailover(ctx context.Context, svc *testenv.Services, writers int, before time.Duration) (FailoverLoss, error) {
	var loss FailoverLoss
	if !svc.Replica {
		return loss, errors.New("measure failover: the services have no replica")
	}
	admin, err := pgx.Connect(ctx, svc.PostgresURL)
	if err != nil {
		return loss, fmt.Errorf("measure failover: connect: %w", err)
	}
	_, err = admin.Exec(ctx, `CREATE TABLE failover_probe (writer int, seq int, PRIMARY KEY (writer, seq))`)
	admin.Close(ctx)
	if err != nil {
		return loss, fmt.Errorf("measure failover: create table: %w", err)
	}

	var (
		mu         sync.Mutex
		acked      = map[[2]int]bool{}
		promoted   bool
		firstAfter bool      // a commit returned after the promotion
		last       time.Time // when the last commit returned
	)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for seq := 0; wctx.Err() == nil; {
				if conn == nil {
					c, err := pgx.Connect(wctx, svc.PostgresURL)
					if err != nil {
						sleep(wctx, 50*time.Millisecond)
						continue
					}
					conn = c
				}
				_, err := conn.Exec(wctx, `INSERT INTO failover_probe (writer, seq) VALUES ($1, $2) ON CONFLICT DO NOTHING`, w, seq)
				if err != nil {
					conn.Close(context.Background())
					conn = nil
					continue // the same seq again: whether it committed is unknown
				}
				mu.Lock()
				acked[[2]int{w, seq}] = true // before the crash, or on the new primary
				now := time.Now()
				if !last.IsZero() {
					loss.Outage = max(loss.Outage, now.Sub(last))
				}
				last = now
				firstAfter = firstAfter || promoted
				mu.Unlock()
				seq++
			}
		})
	}
	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan struct{})
	go func() {
		defer close(lagDone)
		primary, err := pgx.Connect(lagCtx, svc.PostgresURL)
		if err != nil {
			return
		}
		defer primary.Close(context.Background())
		for lagCtx.Err() == nil {
			var lag *time.Duration
			if err := primary.QueryRow(lagCtx, `SELECT replay_lag FROM pg_stat_replication WHERE application_name = 'replica'`).Scan(&lag); err == nil && lag != nil {
				mu.Lock()
				loss.Lag = *lag
				mu.Unlock()
			}
			sleep(lagCtx, 100*time.Millisecond)
		}
	}()
	sleep(ctx, before)
	stopLag()
	<-lagDone
	if err := svc.Failover(ctx); err != nil {
		return loss, err
	}
	mu.Lock()
	promoted = true
	mu.Unlock()
	for {
		mu.Lock()
		ok := firstAfter
		mu.Unlock()
		if ok || !sleep(ctx, 50*time.Millisecond) {
			break
		}
	}
	stop()
	wg.Wait()
	if ctx.Err() != nil {
		return loss, ctx.Err()
	}

	conn, err := pgx.Connect(ctx, svc.PostgresURL)
	if err != nil {
		return loss, fmt.Errorf("measure failover: connect to the new primary: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT writer, seq FROM failover_probe`)
	if err != nil {
		return loss, fmt.Errorf("measure failover: read back: %w", err)
	}
	have := map[[2]int]bool{}
	for rows.Next() {
		var k [2]int
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			return loss, fmt.Errorf("measure failover: read back: %w", err)
		}
		have[k] = true
	}
	if err := rows.Err(); err != nil {
		return loss, fmt.Errorf("measure failover: read back: %w", err)
	}
	loss.Acknowledged = len(acked)
	for k := range acked {
		if !have[k] {
			loss.Missing++
		}
	}
	return loss, nil
}
