package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/bench/internal/benv"
	"github.com/protosaga/saga/bench/internal/report"
	"github.com/protosaga/saga/bench/internal/workload"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// system is one saga implementation under test, set up on a fresh schema and
// vhost.
type system interface {
	// StartBatch starts the sagas of reqs in one transaction (pre-loading,
	// not timed).
	StartBatch(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error
	// Start starts one saga in its own transaction (open-loop load).
	Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error
	// Run processes until ctx is cancelled.
	Run(ctx context.Context) error
	// Completed counts the sagas that finished every step.
	Completed(ctx context.Context) (int, error)
	// Latencies returns step and whole-saga latency percentiles (seconds)
	// over every completed saga.
	Latencies(ctx context.Context) (latency, error)
	// StepsDone counts the saga steps whose reply the orchestrator applied
	// (a completed saga has workload.Steps of them).
	StepsDone(ctx context.Context) (int, error)
	// Unhappy counts sagas that ended or wait anywhere but on the happy
	// path (failed, compensating, in manual review).
	Unhappy(ctx context.Context) (int, error)
	// Statements counts the statements the system's pool sends.
	Statements() *benv.StatementCounter
	Close()
}

// infra is what both systems run on: a fresh schema with a counted pool, and
// a fresh vhost. Embedded, it provides Statements.
type infra struct {
	stmts  benv.StatementCounter
	pool   *pgxpool.Pool
	schema *benv.Schema
	vhost  *benv.VHost
}

// Statements counts the statements the pool sent.
func (b *infra) Statements() *benv.StatementCounter { return &b.stmts }

// usesBroker says whether the system runs on RabbitMQ (the peers without a
// vhost do not, and their measurements leave out the broker's idle CPU).
func (b *infra) usesBroker() bool { return b.vhost != nil }

// close closes the pool and drops the vhost and schema that exist.
func (b *infra) close() {
	if b.pool != nil {
		b.pool.Close()
	}
	if b.vhost != nil {
		b.vhost.Drop()
	}
	if b.schema != nil {
		b.schema.Drop()
	}
}

type latency struct{ stepP50, stepP99, sagaP50, sagaP99 float64 }

// throughput runs the system and keeps at most inflight sagas under way —
// starting more, 100 per transaction, as others complete — until n sagas
// completed or limit passed. Completions per second is the headline;
// commits, statements and CPU are divided by the work done. Bounding the
// sagas in flight keeps every saga well inside its step timeouts (a backlog
// of thousands would trip the contract's 30 s reservation timeout and turn
// the measurement into a compensation storm) and is how a service takes
// load anyway.
func throughput(ctx context.Context, env *benv.Env, sys system, label string, n, inflight int, limit time.Duration, stmtLog io.Writer) ([]report.Metric, error) {
	benv.Settle()
	before, err := env.Sample(ctx)
	if err != nil {
		return nil, err
	}
	sys.Statements().Reset()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- sys.Run(runCtx) }()
	done, _, polls, elapsed, err := drive(ctx, sys, label, n, inflight, limit, runErr)
	statements := sys.Statements().Total() - int64(polls)
	roundTrips := sys.Statements().RoundTrips() - int64(polls)
	cpu, sampleErr := env.Sample(ctx)
	stop()
	if rerr := <-runErr; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
		err = fmt.Errorf("%s: run: %w", label, rerr)
	}
	if err != nil {
		return nil, err
	}
	if sampleErr != nil {
		return nil, sampleErr
	}
	benv.Settle()
	after, err := env.Sample(ctx)
	if err != nil {
		return nil, err
	}
	if done == 0 {
		return nil, fmt.Errorf("%s: no saga of %d completed within %s", label, n, limit)
	}
	steps, err := sys.StepsDone(ctx)
	if err != nil {
		return nil, err
	}
	unhappy, err := sys.Unhappy(ctx)
	if err != nil {
		return nil, err
	}
	// Costs are per saga's worth of work done (steps applied ÷ steps per
	// saga), not per completed saga: when the limit cuts a run short, the
	// sagas still in flight did part of their work. When every saga
	// completed, the two are the same.
	work := float64(steps) / workload.Steps
	d := cpu.Sub(before)
	commits := float64(after.Commits-before.Commits-int64(polls)-5) / float64(steps)
	out := []report.Metric{
		{Name: "sagas/s", Value: float64(done) / elapsed.Seconds()},
		{Name: "saga-equivalents/s (steps applied ÷ 4)", Value: work / elapsed.Seconds()},
		{Name: "commits/step", Value: commits},
		{Name: "commits/saga", Value: commits * workload.Steps},
		{Name: "WAL flushes/saga (cluster)", Value: float64(after.WALSyncs-before.WALSyncs) / work},
		{Name: "client CPU ms/saga", Value: ms(d.Self) / work},
	}
	if p, ok := sys.(interface{ StatementsPartial() bool }); ok && p.StatementsPartial() {
		out = append(out, report.Metric{Name: "statements/saga (executed for this process; not the peer server's)", Value: float64(statements) / work})
	} else {
		out = append(out, report.Metric{Name: "statements/saga (executed)", Value: float64(statements) / work})
		out = append(out, report.Metric{Name: "PostgreSQL round trips/saga", Value: float64(roundTrips) / work})
	}
	rowOps := after.RowsSince(before)
	var rowTotal int64
	for _, r := range rowOps {
		rowTotal += r.Total()
	}
	out = append(out, report.Metric{Name: "row operations/saga (inserted+updated+deleted)", Value: float64(rowTotal) / work})
	if stmtLog != nil {
		fmt.Fprintf(stmtLog, "rows of %s inserted/updated/deleted per saga's worth of steps, by table:\n", label)
		tables := make([]string, 0, len(rowOps))
		for t := range rowOps {
			tables = append(tables, t)
		}
		sort.Strings(tables)
		for _, t := range tables {
			r := rowOps[t]
			fmt.Fprintf(stmtLog, "  %6.2f ins %6.2f upd %6.2f del  %s\n", float64(r.Ins)/work, float64(r.Upd)/work, float64(r.Del)/work, t)
		}
		fmt.Fprintf(stmtLog, "statements of %s executed per saga's worth of steps, by command (polls included):\n", label)
		for i, n := range sys.Statements().ByCommand() {
			fmt.Fprintf(stmtLog, "  %6.2f  %s\n", float64(n)/work, benv.Commands[i])
		}
		fmt.Fprintf(stmtLog, "statement texts sent through pgx's query and batch paths, per saga's worth of steps:\n")
		for _, c := range sys.Statements().Top(25) {
			fmt.Fprintf(stmtLog, "  %6.2f  %s\n", float64(c.Count)/work, c.SQL)
		}
	}
	if done < n { // the limit cut the run short: the rate is still completions per second
		out = append(out, report.Metric{Name: "% of sagas completed within the limit", Value: 100 * float64(done) / float64(n)})
	}
	if unhappy > 0 {
		out = append(out, report.Metric{Name: "sagas failed, compensating or in review", Value: float64(unhappy)})
	}
	if d.PostgresOK {
		out = append(out, report.Metric{Name: "PostgreSQL CPU ms/saga", Value: ms(d.Postgres) / work})
	}
	if b, ok := sys.(interface{ usesBroker() bool }); d.RabbitOK && (!ok || b.usesBroker()) {
		out = append(out, report.Metric{Name: "RabbitMQ CPU ms/saga", Value: ms(d.Rabbit) / work})
	}
	if d.PeerOK {
		out = append(out, report.Metric{Name: env.PeerLabel() + " CPU ms/saga", Value: ms(d.Peer) / work})
	}
	if d.NetworkOK {
		out = append(out, report.Metric{Name: "emulated network (netwire) CPU ms/saga, in no side's total", Value: ms(d.Network) / work})
	}
	if b, ok := sys.(interface{ usesBroker() bool }); d.PostgresOK && d.RabbitOK && !d.PeerOK && (!ok || b.usesBroker()) {
		out = append(out, report.Metric{Name: "total CPU ms/saga (client + PostgreSQL + RabbitMQ)", Value: ms(d.Self+d.Postgres+d.Rabbit) / work})
	}
	return out, nil
}

// drive starts sagas, keeping at most inflight of them under way, and polls
// the completed count every 200 ms until n completed or limit passed. Each
// poll counts over the saga table on the server under test (thousands of
// rows), so polling faster taxes the system being measured.
func drive(ctx context.Context, sys system, label string, n, inflight int, limit time.Duration, runErr <-chan error) (done, started, polls int, elapsed time.Duration, err error) {
	start := time.Now()
	deadline := start.Add(limit)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		for started < n && started-done < inflight {
			k := min(100, n-started, inflight-(started-done))
			reqs := make([]*orderv1.PlaceOrderRequest, k)
			for i := range reqs {
				reqs[i] = workload.Request(label, started+i)
			}
			if err := sys.StartBatch(ctx, reqs); err != nil {
				return done, started, polls, time.Since(start), fmt.Errorf("%s: start sagas %d..%d: %w", label, started, started+k-1, err)
			}
			started += k
		}
		select {
		case <-ctx.Done():
			return done, started, polls, time.Since(start), ctx.Err()
		case rerr := <-runErr:
			return done, started, polls, time.Since(start), fmt.Errorf("system stopped early: %v", rerr)
		case <-tick.C:
		}
		polls++
		c, err := sys.Completed(ctx)
		if err != nil {
			return done, started, polls, time.Since(start), err
		}
		done = c
		if done >= n || time.Now().After(deadline) {
			return done, started, polls, time.Since(start), nil
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// waitCompleted polls the completed count every 100 ms until n sagas
// completed, limit passed, or the system stopped.
func waitCompleted(ctx context.Context, sys system, n int, limit time.Duration, runErr <-chan error) (done, polls int, elapsed time.Duration, err error) {
	start := time.Now()
	deadline := start.Add(limit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return done, polls, time.Since(start), ctx.Err()
		case rerr := <-runErr:
			return done, polls, time.Since(start), fmt.Errorf("system stopped early: %v", rerr)
		case <-tick.C:
		}
		polls++
		c, err := sys.Completed(ctx)
		if err != nil {
			return done, polls, time.Since(start), err
		}
		done = c
		if done >= n || time.Now().After(deadline) {
			return done, polls, time.Since(start), nil
		}
	}
}

// openLoop starts sagas at rate per second for d, each in its own
// transaction, while the system runs, then waits for all of them to complete
// and reports latency percentiles.
func openLoop(ctx context.Context, sys system, label string, rate float64, d, limit time.Duration) ([]report.Metric, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- sys.Run(runCtx) }()
	n := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Go(func() {
			if err := sys.Start(ctx, workload.Request(label, i)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: start: %w", label, err)
	}
	done, _, _, err := waitCompleted(ctx, sys, n, limit, runErr)
	if err != nil {
		return nil, err
	}
	if done < n {
		return nil, fmt.Errorf("%s: only %d of %d sagas completed", label, done, n)
	}
	lat, err := sys.Latencies(ctx)
	stop()
	<-runErr
	if err != nil {
		return nil, err
	}
	return []report.Metric{
		{Name: "step p50 ms", Value: lat.stepP50 * 1000},
		{Name: "step p99 ms", Value: lat.stepP99 * 1000},
		{Name: "saga p50 ms", Value: lat.sagaP50 * 1000},
		{Name: "saga p99 ms", Value: lat.sagaP99 * 1000},
	}, nil
}

// countQuery runs a count(*) query.
func countQuery(ctx context.Context, pool *pgxpool.Pool, sql string) (int, error) {
	var n int
	if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, fmt.Errorf("count (%s): %w", sql, err)
	}
	return n, nil
}

// latencyQuery reads four percentiles (seconds) from sql.
func latencyQuery(ctx context.Context, pool *pgxpool.Pool, stepSQL, sagaSQL string) (latency, error) {
	var l latency
	if err := pool.QueryRow(ctx, stepSQL).Scan(&l.stepP50, &l.stepP99); err != nil {
		return l, fmt.Errorf("step latency: %w", err)
	}
	if err := pool.QueryRow(ctx, sagaSQL).Scan(&l.sagaP50, &l.sagaP99); err != nil {
		return l, fmt.Errorf("saga latency: %w", err)
	}
	return l, nil
}
