package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/bench/internal/benv"
	"github.com/protosaga/saga/bench/internal/dbossaga"
	"github.com/protosaga/saga/bench/internal/report"
	"github.com/protosaga/saga/bench/internal/shop"
	"github.com/protosaga/saga/bench/internal/temporalsaga"
	"github.com/protosaga/saga/bench/internal/wm"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// stepsDoneSQL counts the journaled effects that complete a step (the
// peers' steps applied).
const stepsDoneSQL = `SELECT count(*) FROM shop_ledger WHERE effect IN ` + shop.StepEffects

// temporalConfig is what a Temporal measurement varies.
type temporalConfig struct {
	Pollers int // workflow-task and activity-task pollers each
}

func (c temporalConfig) String() string { return fmt.Sprintf("pollers %d", c.Pollers) }

// temporalSystem is the Temporal saga: a Temporal server on two fresh
// databases of its own, started for the measurement, and the worker and
// client in this process on a fresh schema for the participants' tables.
type temporalSystem struct {
	infra
	dir       string
	server    *temporalsaga.Server
	vis       *pgxpool.Pool // the server's visibility database: completed workflows
	saga      *temporalsaga.Saga
	stopCount func()
}

func newTemporal(ctx context.Context, env *benv.Env, o options, c temporalConfig, logger *slog.Logger) (*temporalSystem, error) {
	s := &temporalSystem{}
	var err error
	if s.schema, err = env.NewSchema(ctx, "tp"); err != nil {
		return nil, err
	}
	// 20 activity connections; the rest is headroom for polls.
	if s.pool, err = s.schema.Pool(ctx, 24, &s.stmts); err != nil {
		s.Close()
		return nil, err
	}
	if s.dir, err = os.MkdirTemp("", "sagabench-temporal-"); err != nil {
		s.Close()
		return nil, fmt.Errorf("temporal: work dir: %w", err)
	}
	host, port, user, _ := env.PGConn()
	if s.server, err = temporalsaga.StartServer(ctx, temporalsaga.ServerConfig{
		Bin: o.temporalBin, SQLTool: o.temporalSQLTool, PGHost: host, PGPort: port, PGUser: user, PGPassword: env.PGPassword(),
		Shards: o.temporalShards, Dir: s.dir, Logger: logger,
	}); err != nil {
		s.Close()
		return nil, err
	}
	visCfg, err := pgxpool.ParseConfig(env.DatabaseURL(s.server.VisibilityDB))
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("temporal: visibility pool: %w", err)
	}
	visCfg.MaxConns = 2
	if s.vis, err = pgxpool.NewWithConfig(ctx, visCfg); err != nil {
		s.Close()
		return nil, fmt.Errorf("temporal: visibility pool: %w", err)
	}
	if s.saga, err = temporalsaga.New(ctx, temporalsaga.Config{
		Pool: s.pool, HostPort: s.server.HostPort, Namespace: s.server.Namespace, Pollers: c.Pollers, Logger: logger,
	}); err != nil {
		s.Close()
		return nil, err
	}
	if err := wm.Restock(ctx, s.pool); err != nil {
		s.Close()
		return nil, err
	}
	s.stopCount = env.CountPeer("Temporal server", s.server.PID(), s.server.DB, s.server.VisibilityDB)
	return s, nil
}

// StartBatch starts the workflows of reqs, 32 calls at a time: Temporal
// starts each workflow in its own request.
func (s *temporalSystem) StartBatch(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error {
	sem := make(chan struct{}, 32)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, r := range reqs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.saga.Start(ctx, r); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d starts failed, first: %w", len(errs), len(reqs), errs[0])
	}
	return nil
}

func (s *temporalSystem) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	return s.saga.Start(ctx, req)
}

func (s *temporalSystem) Run(ctx context.Context) error { return s.saga.Run(ctx) }

// Completed counts closed-as-completed workflows in the server's visibility
// store (status 2: WORKFLOW_EXECUTION_STATUS_COMPLETED).
func (s *temporalSystem) Completed(ctx context.Context) (int, error) {
	return countQuery(ctx, s.vis, `SELECT count(*) FROM executions_visibility WHERE workflow_type_name = 'PlaceOrder' AND status = 2`)
}

func (s *temporalSystem) StepsDone(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, stepsDoneSQL)
}

// Unhappy counts workflows that closed any way but completed.
func (s *temporalSystem) Unhappy(ctx context.Context) (int, error) {
	return countQuery(ctx, s.vis, `SELECT count(*) FROM executions_visibility WHERE workflow_type_name = 'PlaceOrder' AND status NOT IN (1, 2)`)
}

// StatementsPartial: the server's statements are not counted.
func (s *temporalSystem) StatementsPartial() bool { return true }

// Latencies: a step is the time between two consecutive step effects of one
// order in shop_ledger (at = the start of the effect's transaction), the
// first one from the workflow's start time; the whole saga is the
// workflow's start to close time in the visibility store.
func (s *temporalSystem) Latencies(ctx context.Context) (latency, error) {
	var l latency
	starts := map[string]time.Time{}
	var sagas []float64
	rows, err := s.vis.Query(ctx, `SELECT workflow_id, start_time, close_time FROM executions_visibility WHERE workflow_type_name = 'PlaceOrder' AND status = 2`)
	if err != nil {
		return l, fmt.Errorf("temporal: read workflow times: %w", err)
	}
	for rows.Next() {
		var id string
		var start, end time.Time
		if err := rows.Scan(&id, &start, &end); err != nil {
			rows.Close()
			return l, fmt.Errorf("temporal: read workflow times: %w", err)
		}
		starts[id] = start
		sagas = append(sagas, end.Sub(start).Seconds())
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return l, fmt.Errorf("temporal: read workflow times: %w", err)
	}
	rows, err = s.pool.Query(ctx, `SELECT order_id, at FROM shop_ledger WHERE effect IN `+shop.StepEffects+` ORDER BY order_id, id`)
	if err != nil {
		return l, fmt.Errorf("temporal: read step times: %w", err)
	}
	var steps []float64
	var prevOrder string
	var prev time.Time
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return l, fmt.Errorf("temporal: read step times: %w", err)
		}
		start, completed := starts[id]
		if !completed {
			continue
		}
		if id != prevOrder {
			prev, prevOrder = start, id
		}
		steps = append(steps, at.Sub(prev).Seconds())
		prev = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return l, fmt.Errorf("temporal: read step times: %w", err)
	}
	l.stepP50, l.stepP99 = percentile(steps, 0.5), percentile(steps, 0.99)
	l.sagaP50, l.sagaP99 = percentile(sagas, 0.5), percentile(sagas, 0.99)
	return l, nil
}

func (s *temporalSystem) Close() {
	if s.saga != nil {
		s.saga.Close()
	}
	if s.stopCount != nil {
		s.stopCount()
	}
	if s.vis != nil {
		s.vis.Close()
	}
	if s.server != nil {
		s.server.Stop()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
	s.close()
}

// percentile is PostgreSQL's percentile_cont of xs (sorted in place).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	pos := p * float64(len(xs)-1)
	i := int(pos)
	if i+1 >= len(xs) {
		return xs[len(xs)-1]
	}
	return xs[i] + (pos-float64(i))*(xs[i+1]-xs[i])
}

// dbosConfig is what a DBOS measurement varies.
type dbosConfig struct {
	Concurrency int
	Poll        time.Duration
}

func (c dbosConfig) String() string {
	return fmt.Sprintf("queue concurrency %d, polling %s", c.Concurrency, c.Poll)
}

// dbosSystem is the DBOS saga in this process on a fresh schema (its
// system tables and the participants' tables).
type dbosSystem struct {
	infra
	// dbosPool serves DBOS and the workflows' steps; DBOS closes it when it
	// shuts down, so the measurement's own queries use infra's pool.
	dbosPool *pgxpool.Pool
	saga     *dbossaga.Saga
}

func newDBOS(ctx context.Context, env *benv.Env, c dbosConfig, logger *slog.Logger) (*dbosSystem, error) {
	s := &dbosSystem{}
	var err error
	if s.schema, err = env.NewSchema(ctx, "dbos"); err != nil {
		return nil, err
	}
	if s.pool, err = s.schema.Pool(ctx, 4, &s.stmts); err != nil {
		s.Close()
		return nil, err
	}
	if s.dbosPool, err = s.schema.Pool(ctx, 20, &s.stmts); err != nil {
		s.Close()
		return nil, err
	}
	if s.saga, err = dbossaga.New(ctx, dbossaga.Config{
		Pool: s.dbosPool, Schema: s.schema.Name, Concurrency: c.Concurrency, Poll: c.Poll, Logger: logger,
	}); err != nil {
		s.Close()
		return nil, err
	}
	if err := wm.Restock(ctx, s.pool); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *dbosSystem) StartBatch(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error {
	return s.saga.StartBatch(ctx, s.dbosPool, reqs)
}

func (s *dbosSystem) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	return s.saga.Start(ctx, req)
}

func (s *dbosSystem) Run(ctx context.Context) error { return s.saga.Run(ctx) }

func (s *dbosSystem) Completed(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'`)
}

func (s *dbosSystem) StepsDone(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, stepsDoneSQL)
}

func (s *dbosSystem) Unhappy(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM workflow_status WHERE status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')`)
}

// Latencies: steps as for Temporal (consecutive step effects in shop_ledger,
// the first from the workflow's enqueue time); the whole saga is
// workflow_status.created_at (enqueued) to updated_at (completed), in ms.
func (s *dbosSystem) Latencies(ctx context.Context) (latency, error) {
	return latencyQuery(ctx, s.pool, `
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT extract(epoch FROM l.at - coalesce(lag(l.at) OVER (PARTITION BY l.order_id ORDER BY l.id), to_timestamp(w.created_at / 1000.0))) AS s
  FROM shop_ledger l JOIN workflow_status w ON w.workflow_uuid = l.order_id
  WHERE w.status = 'SUCCESS' AND l.effect IN `+shop.StepEffects+`) d`,
		`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT (updated_at - created_at) / 1000.0 AS s FROM workflow_status WHERE status = 'SUCCESS') d`)
}

func (s *dbosSystem) Close() {
	if s.dbosPool != nil {
		s.dbosPool.Close() // a no-op once DBOS has closed it
	}
	s.close()
}

// peerNotes compares the runtime's best configuration with each peer's best
// setting (medians): completed sagas per second, and what one completed
// saga costs in commits, WAL flushes and CPU.
func peerNotes(t *report.Table, oursNames []string, peers map[string][]string) {
	best := func(names []string) (string, float64) {
		bn, bv := "", math.NaN()
		for _, n := range names {
			if v := t.Median(n, "sagas/s"); !math.IsNaN(v) && (math.IsNaN(bv) || v > bv) {
				bn, bv = n, v
			}
		}
		return bn, bv
	}
	oursName, ours := best(oursNames)
	cost := func(name string) string {
		cpu := 0.0
		var parts []string
		for _, m := range []string{"client CPU ms/saga", "PostgreSQL CPU ms/saga", "RabbitMQ CPU ms/saga", "Temporal server CPU ms/saga"} {
			if v := t.Median(name, m); !math.IsNaN(v) {
				cpu += v
				parts = append(parts, strings.TrimSuffix(m, " CPU ms/saga")+" "+report.Format(v))
			}
		}
		return fmt.Sprintf("%s commits/step, %s WAL flushes/saga, CPU %s ms/saga (%s)",
			report.Format(t.Median(name, "commits/step")), report.Format(t.Median(name, "WAL flushes/saga (cluster)")),
			report.Format(cpu), strings.Join(parts, " + "))
	}
	labels := make([]string, 0, len(peers))
	for l := range peers {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	for _, label := range labels {
		name, v := best(peers[label])
		if name == "" {
			continue
		}
		if oursName != "" {
			const work = "saga-equivalents/s (steps applied ÷ 4)"
			t.Note("ours / %s (completed sagas/s, best setting of each): **%.2f×** (%s against %s sagas/s); by steps applied ÷ 4: %.2f×",
				label, ours/v, report.Format(ours), report.Format(v), t.Median(oursName, work)/t.Median(name, work))
		}
		t.Note("%s best: %s — %s", label, name, cost(name))
	}
	if oursName != "" && len(labels) > 0 {
		t.Note("saga runtime best: %s — %s", oursName, cost(oursName))
	}
}
