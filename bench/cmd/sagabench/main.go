// Command sagabench measures the saga runtime next to its peers in one run
// and prints one Markdown table: the raw limits of this machine's RabbitMQ
// and PostgreSQL, a Watermill build of the same Place Order saga, and the
// Place Order example on the saga runtime (completed sagas per second, relay
// throughput, step latency, commits per step, CPU per saga). With -only
// naming them, also the same saga on Temporal (its server on PostgreSQL,
// started per measurement) and on DBOS.
//
//	cd bench && go run ./cmd/sagabench [-quick] [-runs 3] [-sagas 10000] [-workers 2,4]
//
// Every measurement runs in a fresh schema of a database created for the run
// (so pg_stat_database counts only the benchmark's commits) and a fresh
// RabbitMQ vhost. Measurements are interleaved round by round (every
// measurement once, then again), and the table reports the median with
// min–max. Server addresses come from SAGA_PG_URL, SAGA_AMQP_URL and
// SAGA_RABBIT_API (scripts/with-services.sh exports them).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/protosaga/saga/bench/internal/benv"
	"github.com/protosaga/saga/bench/internal/raw"
	"github.com/protosaga/saga/bench/internal/report"
	"github.com/protosaga/saga/bench/internal/temporalsaga"
	"github.com/protosaga/saga/bench/internal/workload"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "sagabench: %v\n", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	quick         bool
	runs          int
	sagas, wmSags int
	inflight      int
	workers       []int
	batch         int
	queueType     string
	rawDuration   time.Duration
	pgbenchTime   time.Duration
	pgbenchCl     []int
	relayRows     int
	lowRate       float64
	latencyFor    time.Duration
	limit         time.Duration
	only          map[string]bool
	cpuProfile    string
	out           string
	statements    bool
	stderr        io.Writer
	logged        map[string]bool
	pgbenchBin    string
	dbosSagas     int
	temporalSagas int
	// Temporal: the server and its schema tool, pollers per measurement,
	// history shards.
	temporalBin, temporalSQLTool string
	temporalPollers              []int
	temporalShards               int
	// DBOS: queue worker concurrency per measurement, polling interval.
	dbosConcurrency []int
	dbosPoll        time.Duration
}

func parse(args []string, stderr io.Writer) (options, error) {
	o := options{stderr: stderr, logged: map[string]bool{}}
	fs := flag.NewFlagSet("sagabench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.quick, "quick", false, "smoke run (< 30 s): one run, small sizes, short durations")
	fs.IntVar(&o.runs, "runs", 3, "rounds of every measurement (medians with min–max)")
	fs.IntVar(&o.sagas, "sagas", 10000, "sagas per throughput measurement of the runtime")
	fs.IntVar(&o.wmSags, "wm-sagas", 3000, "sagas per throughput measurement of the Watermill build")
	fs.IntVar(&o.inflight, "inflight", 500, "most sagas under way at once in throughput measurements (more start as others complete)")
	workers := fs.String("workers", "2,4", "consumer workers (app.Config.Concurrency) per runtime throughput measurement")
	fs.IntVar(&o.batch, "batch", 0, "consumer batch size (app.Config.BatchSize); 0 = the consumer's default")
	fs.StringVar(&o.queueType, "queue-type", "quorum", "work queue type on both sides: quorum or classic")
	fs.DurationVar(&o.rawDuration, "raw-duration", 3*time.Second, "duration of each raw RabbitMQ measurement")
	fs.DurationVar(&o.pgbenchTime, "pgbench-duration", 4*time.Second, "duration of each pgbench run")
	clients := fs.String("pgbench-clients", "1,4,16", "pgbench client counts")
	fs.IntVar(&o.relayRows, "relay-rows", 30000, "outbox rows per relay measurement")
	fs.Float64Var(&o.lowRate, "low-rate", 20, "offered sagas/s for the low-load latency measurement (at most a quarter of the side's measured capacity)")
	fs.DurationVar(&o.latencyFor, "latency-duration", 10*time.Second, "how long each latency measurement offers load")
	fs.DurationVar(&o.limit, "limit", 60*time.Second, "longest any one measurement may take")
	only := fs.String("only", "", "comma-separated groups to run: raw,pg,watermill,ours,relay,latency (default all of these), temporal, dbos (only when named)")
	fs.IntVar(&o.dbosSagas, "dbos-sagas", 3000, "sagas per throughput measurement of the DBOS build")
	fs.IntVar(&o.temporalSagas, "temporal-sagas", 300, "sagas per throughput measurement of the Temporal build")
	temporalDir := fs.String("temporal", "", "directory of the Temporal server binaries `server` and `sql` (bench/temporal/build.sh prints it)")
	temporalPollers := fs.String("temporal-pollers", "2,8", "Temporal worker: workflow-task and activity-task pollers each, per measurement")
	fs.IntVar(&o.temporalShards, "temporal-shards", 4, "Temporal server: persistence.numHistoryShards")
	dbosConcurrency := fs.String("dbos-concurrency", "20,100", "DBOS queue: worker concurrency per measurement")
	fs.DurationVar(&o.dbosPoll, "dbos-poll", 100*time.Millisecond, "DBOS queue: base polling interval")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the runtime's first throughput or relay measurement here")
	fs.StringVar(&o.out, "out", "", "also write the report to this file")
	fs.BoolVar(&o.statements, "statements", false, "print each saga configuration's statements per saga by command and its most frequent statement texts to stderr (first round); tracing the texts costs the client CPU")
	fs.StringVar(&o.pgbenchBin, "pgbench", "", "pgbench binary (default: $PATH, then /usr/lib/postgresql/15/bin/pgbench)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.workers, err = ints(*workers); err != nil {
		return o, fmt.Errorf("-workers: %w", err)
	}
	if o.pgbenchCl, err = ints(*clients); err != nil {
		return o, fmt.Errorf("-pgbench-clients: %w", err)
	}
	if o.temporalPollers, err = ints(*temporalPollers); err != nil {
		return o, fmt.Errorf("-temporal-pollers: %w", err)
	}
	if o.dbosConcurrency, err = ints(*dbosConcurrency); err != nil {
		return o, fmt.Errorf("-dbos-concurrency: %w", err)
	}
	if *temporalDir != "" {
		o.temporalBin, o.temporalSQLTool = filepath.Join(*temporalDir, "server"), filepath.Join(*temporalDir, "sql")
	}
	o.only = map[string]bool{}
	for _, g := range strings.Split(*only, ",") {
		if g = strings.TrimSpace(g); g != "" {
			o.only[g] = true
		}
	}
	if o.quick {
		o.runs, o.sagas, o.wmSags, o.inflight = 1, 300, 150, 150
		o.workers = []int{4}
		o.dbosSagas, o.temporalSagas = 150, 50
		o.temporalPollers, o.dbosConcurrency = o.temporalPollers[:1], o.dbosConcurrency[:1]
		o.rawDuration, o.pgbenchTime, o.pgbenchCl = 500*time.Millisecond, time.Second, []int{4}
		o.relayRows, o.latencyFor = 2000, 2*time.Second
		o.limit = 20 * time.Second
	}
	switch {
	case o.runs < 1:
		return o, fmt.Errorf("-runs %d: want at least 1", o.runs)
	case o.sagas < 1 || o.wmSags < 1 || o.dbosSagas < 1 || o.temporalSagas < 1 || o.inflight < 1:
		return o, errors.New("-sagas, -wm-sagas, -dbos-sagas, -temporal-sagas and -inflight must be positive")
	case o.wantPeer("temporal") && (o.temporalBin == "" || o.temporalShards < 1):
		return o, errors.New("-only temporal needs -temporal DIR (bench/temporal/build.sh builds the server) and -temporal-shards ≥ 1")
	case o.wantPeer("dbos") && o.dbosPoll <= 0:
		return o, errors.New("-dbos-poll must be positive")
	case o.queueType != "quorum" && o.queueType != "classic":
		return o, fmt.Errorf("-queue-type %q: want quorum or classic", o.queueType)
	case o.lowRate <= 0:
		return o, errors.New("-low-rate must be positive")
	}
	return o, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// stmtLog is where the first run of a saga measurement lists its
// statements, or nil.
func (o options) stmtLog(name string) io.Writer {
	if !o.statements || o.logged[name] {
		return nil
	}
	o.logged[name] = true
	return o.stderr
}

func (o options) want(group string) bool { return len(o.only) == 0 || o.only[group] }

// wantPeer says whether a peer group that runs only when named (temporal,
// dbos) was named.
func (o options) wantPeer(group string) bool { return o.only[group] }

// measurement is one row group of the table, run once per round.
type measurement struct {
	group, name string
	run         func(ctx context.Context) ([]report.Metric, error)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	env, err := benv.FromEnv(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	env.TraceStatementText(o.statements)
	progress := func(format string, args ...any) {
		fmt.Fprintf(stderr, "sagabench %s: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	loadBefore := benv.LoadAvg()
	started := time.Now()
	progress("database %s, load average %s, %d CPUs", env.Database(), loadBefore, runtime.NumCPU())
	rtt, err := env.RoundTrip(ctx, 200)
	if err != nil {
		return err
	}
	network := fmt.Sprintf("PostgreSQL round trip (SELECT 1) p50 %.3f ms, p99 %.3f ms", ms(rtt.P50), ms(rtt.P99))
	if set := os.Getenv("SAGA_HOSTS_RTT_MS"); set != "" {
		network = fmt.Sprintf("separate hosts (scripts/hosts.sh, %s ms round trip added); ", set) + network
	}
	progress("%s", network)

	var ms []measurement
	add := func(group, name string, f func(ctx context.Context) ([]report.Metric, error)) {
		ms = append(ms, measurement{group, name, f})
	}
	if o.want("raw") {
		addRaw(env, o, add)
	}
	if o.want("pg") {
		if err := addPG(ctx, env, o, add); err != nil {
			return err
		}
	}
	wmName := fmt.Sprintf("Watermill, 8 handlers, %d sagas", o.wmSags)
	if o.want("watermill") {
		add("saga throughput", wmName, func(ctx context.Context) ([]report.Metric, error) {
			sys, err := newWM(ctx, env, o.queueType, logger)
			if err != nil {
				return nil, err
			}
			defer sys.Close()
			out, err := throughput(ctx, env, sys, "wm", o.wmSags, o.inflight, o.limit, o.stmtLog("wm"))
			if err == nil {
				err = sys.errors()
			}
			return out, err
		})
	}
	// profile starts the CPU profile (-cpuprofile) for the first
	// measurement of the runtime, throughput or relay, that asks for it.
	profiled := false
	profile := func() (stop func(), err error) {
		if o.cpuProfile == "" || profiled {
			return func() {}, nil
		}
		profiled = true
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		return func() { pprof.StopCPUProfile(); f.Close() }, nil
	}
	var oursNames []string
	if o.want("ours") {
		for _, w := range o.workers {
			c := oursConfig{Concurrency: w, BatchSize: o.batch, QueueType: o.queueType}
			name := fmt.Sprintf("saga runtime, %s, %d sagas", c, o.sagas)
			oursNames = append(oursNames, name)
			add("saga throughput", name, func(ctx context.Context) ([]report.Metric, error) {
				sys, err := newOurs(ctx, env, c, logger)
				if err != nil {
					return nil, err
				}
				defer sys.Close()
				stop, err := profile()
				if err != nil {
					return nil, err
				}
				defer stop()
				return throughput(ctx, env, sys, "ours", o.sagas, o.inflight, o.limit, o.stmtLog(name))
			})
		}
	}
	var temporalNames, dbosNames []string
	if o.wantPeer("temporal") {
		if err := (temporalsaga.ServerConfig{Bin: o.temporalBin, SQLTool: o.temporalSQLTool}).Check(); err != nil {
			return err
		}
		for _, p := range o.temporalPollers {
			c := temporalConfig{Pollers: p}
			name := fmt.Sprintf("Temporal on PostgreSQL, %s, %d sagas", c, o.temporalSagas)
			temporalNames = append(temporalNames, name)
			add("saga throughput", name, func(ctx context.Context) ([]report.Metric, error) {
				sys, err := newTemporal(ctx, env, o, c, logger)
				if err != nil {
					return nil, err
				}
				defer sys.Close()
				return throughput(ctx, env, sys, "tp", o.temporalSagas, o.inflight, o.limit, o.stmtLog(name))
			})
		}
	}
	if o.wantPeer("dbos") {
		for _, n := range o.dbosConcurrency {
			c := dbosConfig{Concurrency: n, Poll: o.dbosPoll}
			name := fmt.Sprintf("DBOS, %s, %d sagas", c, o.dbosSagas)
			dbosNames = append(dbosNames, name)
			add("saga throughput", name, func(ctx context.Context) ([]report.Metric, error) {
				sys, err := newDBOS(ctx, env, c, logger)
				if err != nil {
					return nil, err
				}
				defer sys.Close()
				return throughput(ctx, env, sys, "dbos", o.dbosSagas, o.inflight, o.limit, o.stmtLog(name))
			})
		}
	}
	relayNames := map[string]string{}
	if o.want("relay") {
		// The defaults, two relays, and the defaults before the relay was
		// pipelined (batch 100, window 256) for comparison.
		configs := []struct{ relays, batch, window int }{{1, 0, 0}, {2, 0, 0}, {1, 100, 256}}
		if o.quick {
			configs = configs[:1]
		}
		for _, rc := range configs {
			name := fmt.Sprintf("outbox relay ×%d", rc.relays)
			if rc.batch == 0 {
				name += " (batch 500, window 1024: defaults)"
			} else {
				name += fmt.Sprintf(" (batch %d, window %d)", rc.batch, rc.window)
			}
			relayNames[fmt.Sprint(rc.relays, rc.batch)] = name
			add("relay", fmt.Sprintf("%s, %d rows", name, o.relayRows), func(ctx context.Context) ([]report.Metric, error) {
				stop, err := profile()
				if err != nil {
					return nil, err
				}
				defer stop()
				return relayBench(ctx, env, rc.relays, rc.batch, rc.window, o.relayRows, o.limit, logger)
			})
		}
	}

	sameShapeName := fmt.Sprintf("raw publish of the relay's messages (same headers, exchange, routing key, mandatory, window %d), %d msgs", relayWindow, o.relayRows)
	if o.want("relay") {
		add("relay", sameShapeName, func(ctx context.Context) ([]report.Metric, error) {
			return sameShapeBench(ctx, env, o.relayRows, logger)
		})
	}

	var t report.Table
	var failures []string
	for round := 1; round <= o.runs; round++ {
		for _, m := range ms {
			if err := ctx.Err(); err != nil {
				return err
			}
			progress("round %d/%d: %s (load %s)", round, o.runs, m.name, benv.LoadAvg())
			mctx, cancel := context.WithTimeout(ctx, o.limit+90*time.Second) // setup and draining on top of the limit
			metrics, err := m.run(mctx)
			cancel()
			if err != nil {
				progress("FAILED %s: %v", m.name, err)
				failures = append(failures, fmt.Sprintf("%s (round %d): %v", m.name, round, err))
				continue
			}
			t.Add(m.group, m.name, metrics...)
		}
	}

	// Latency: once per side, at low load and at 75% of the side's own median
	// throughput from the rounds above (near its capacity, unsaturated); the
	// runtime also at Watermill's 75% rate, so the two are compared at the
	// same offered load as well.
	if o.want("latency") {
		type side struct {
			name     string
			capacity float64
			newSys   func(ctx context.Context) (system, error)
			also     []float64 // further offered rates
		}
		bestOurs := math.NaN()
		bestCfg := oursConfig{QueueType: o.queueType, BatchSize: o.batch}
		for i, n := range oursNames {
			if v := t.Median(n, "sagas/s"); !math.IsNaN(v) && (math.IsNaN(bestOurs) || v > bestOurs) {
				bestOurs, bestCfg.Concurrency = v, o.workers[i]
			}
		}
		sides := []side{
			{name: "saga runtime, " + bestCfg.String(), capacity: bestOurs,
				newSys: func(ctx context.Context) (system, error) { return newOurs(ctx, env, bestCfg, logger) }},
		}
		if !o.quick {
			wmCapacity := t.Median(wmName, "sagas/s")
			sides = append(sides, side{name: "Watermill, 8 handlers", capacity: wmCapacity,
				newSys: func(ctx context.Context) (system, error) { return newWM(ctx, env, o.queueType, logger) }})
			if !math.IsNaN(wmCapacity) {
				sides[0].also = []float64{math.Round(wmCapacity * 0.75)}
			}
		}
		// The peers: each at its best measured setting.
		best := func(names []string) (int, float64) {
			bi, bv := -1, math.NaN()
			for i, n := range names {
				if v := t.Median(n, "sagas/s"); !math.IsNaN(v) && (math.IsNaN(bv) || v > bv) {
					bi, bv = i, v
				}
			}
			return bi, bv
		}
		if o.wantPeer("temporal") {
			i, v := best(temporalNames)
			c := temporalConfig{Pollers: o.temporalPollers[max(i, 0)]}
			sides = append(sides, side{name: "Temporal on PostgreSQL, " + c.String(), capacity: v,
				newSys: func(ctx context.Context) (system, error) { return newTemporal(ctx, env, o, c, logger) }})
		}
		if o.wantPeer("dbos") {
			i, v := best(dbosNames)
			c := dbosConfig{Concurrency: o.dbosConcurrency[max(i, 0)], Poll: o.dbosPoll}
			sides = append(sides, side{name: "DBOS, " + c.String(), capacity: v,
				newSys: func(ctx context.Context) (system, error) { return newDBOS(ctx, env, c, logger) }})
		}
		for _, sd := range sides {
			// Low load is at most a quarter of the side's capacity: the
			// default rate is above what the slowest peers complete.
			low := o.lowRate
			if !math.IsNaN(sd.capacity) && sd.capacity/4 < low {
				low = math.Max(1, math.Round(sd.capacity/4))
			}
			rates := []float64{low}
			if !math.IsNaN(sd.capacity) && !o.quick {
				rates = append(rates, math.Round(sd.capacity*0.75))
			}
			for _, r := range sd.also {
				if !slices.Contains(rates, r) {
					rates = append(rates, r)
				}
			}
			for _, rate := range rates {
				name := fmt.Sprintf("%s, %.0f sagas/s offered", sd.name, rate)
				progress("latency: %s (load %s)", name, benv.LoadAvg())
				mctx, cancel := context.WithTimeout(ctx, o.limit+90*time.Second)
				sys, err := sd.newSys(mctx)
				if err == nil {
					var metrics []report.Metric
					metrics, err = openLoop(mctx, sys, "lat", rate, o.latencyFor, o.limit)
					sys.Close()
					t.Add("latency", name, metrics...)
				}
				cancel()
				if err != nil {
					progress("FAILED %s: %v", name, err)
					failures = append(failures, fmt.Sprintf("%s: %v", name, err))
				}
			}
		}
	}

	notes(&t, o, wmName, oursNames, relayNames, sameShapeName)
	peerNotes(&t, oursNames, map[string][]string{"Temporal on PostgreSQL": temporalNames, "DBOS": dbosNames})
	var b strings.Builder
	fmt.Fprintf(&b, "sagabench %s — %s, %d CPUs, %s; load average %s at start, %s at end; %s total\n%s\n\n",
		strings.Join(args, " "), started.Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.Version(),
		loadBefore, benv.LoadAvg(), time.Since(started).Round(time.Second), network)
	t.Print(&b)
	if len(failures) > 0 {
		fmt.Fprintf(&b, "\nFAILED measurements:\n")
		for _, f := range failures {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	fmt.Fprint(stdout, b.String())
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", o.out, err)
		}
	}
	if len(failures) > 0 {
		return fmt.Errorf("%d measurements failed", len(failures))
	}
	return nil
}

func addRaw(env *benv.Env, o options, add func(string, string, func(context.Context) ([]report.Metric, error))) {
	vhost := func(ctx context.Context, f func(url string) (raw.Rate, error)) ([]report.Metric, error) {
		vh, err := env.NewVHost(ctx, "raw")
		if err != nil {
			return nil, err
		}
		defer vh.Drop()
		r, err := f(vh.URL)
		if err != nil {
			return nil, err
		}
		return []report.Metric{{Name: "msgs/s", Value: r.PerSecond()}}, nil
	}
	for _, p := range []struct {
		qt     string
		window int
	}{{"quorum", 256}, {"classic", 256}, {"quorum", 1}, {"classic", 1}} {
		name := fmt.Sprintf("publish persistent 300 B, confirms window %d, %s queue", p.window, p.qt)
		if p.window == 1 {
			name = fmt.Sprintf("publish persistent 300 B, one confirm at a time, %s queue", p.qt)
		}
		add("raw RabbitMQ", name, func(ctx context.Context) ([]report.Metric, error) {
			return vhost(ctx, func(url string) (raw.Rate, error) {
				return raw.Publish(ctx, url, p.qt, p.window, o.rawDuration, 0)
			})
		})
	}
	for _, c := range []struct {
		qt       string
		prefetch int
		perSec   int // expected rate: fill enough for rawDuration
	}{{"quorum", 1, 2500}, {"quorum", 500, 40000}, {"classic", 1, 6000}, {"classic", 500, 20000}} {
		fill := int(float64(c.perSec) * o.rawDuration.Seconds())
		add("raw RabbitMQ", fmt.Sprintf("consume+ack, %s queue, prefetch %d", c.qt, c.prefetch), func(ctx context.Context) ([]report.Metric, error) {
			return vhost(ctx, func(url string) (raw.Rate, error) {
				return raw.Consume(ctx, url, c.qt, c.prefetch, fill, o.rawDuration)
			})
		})
	}
}

func addPG(ctx context.Context, env *benv.Env, o options, add func(string, string, func(context.Context) ([]report.Metric, error))) error {
	bin := o.pgbenchBin
	if bin == "" {
		var err error
		if bin, err = raw.FindPGBench(); err != nil {
			return err
		}
	}
	host, port, user, db := env.PGConn()
	const sagas = 10000
	type variant struct{ name, script string }
	variants := []variant{{"pgbench saga-step transaction", raw.StepScript}}
	if !o.quick {
		variants = append(variants,
			variant{"pgbench saga-step transaction + pg_notify in it (as outbox.Enqueue)", raw.StepNotifyScript},
			variant{"pgbench saga-step transaction, then pg_notify in its own transaction", raw.StepNotifyAfterScript})
	}
	for _, v := range variants {
		for _, clients := range o.pgbenchCl {
			add("raw PostgreSQL", fmt.Sprintf("%s, %d clients", v.name, clients), func(ctx context.Context) ([]report.Metric, error) {
				sc, err := env.NewSchema(ctx, "pgbench")
				if err != nil {
					return nil, err
				}
				defer sc.Drop()
				pool, err := sc.Pool(ctx, 2)
				if err != nil {
					return nil, err
				}
				err = raw.PGBenchSetup(ctx, pool, sagas)
				pool.Close()
				if err != nil {
					return nil, err
				}
				dir, err := os.MkdirTemp("", "sagabench-pgbench-")
				if err != nil {
					return nil, fmt.Errorf("pgbench dir: %w", err)
				}
				defer os.RemoveAll(dir)
				tps, err := raw.PGBench{Bin: bin, Host: host, Port: port, User: user, DB: db, Password: env.PGPassword(),
					Schema: sc.Name, Sagas: sagas, Clients: clients, Duration: o.pgbenchTime, Dir: dir, Script: v.script}.Run(ctx)
				if err != nil {
					return nil, err
				}
				return []report.Metric{
					{Name: "commits/s", Value: tps},
					{Name: fmt.Sprintf("ceiling sagas/s (÷ %d steps)", workload.Steps), Value: tps / workload.Steps},
				}, nil
			})
		}
	}
	return nil
}

// notes adds the ratios the issue asks for, from medians.
func notes(t *report.Table, o options, wmName string, oursNames []string, relayNames map[string]string, sameShapeName string) {
	best, bestName := math.NaN(), ""
	for _, n := range oursNames {
		if v := t.Median(n, "sagas/s"); !math.IsNaN(v) && (math.IsNaN(best) || v > best) {
			best, bestName = v, n
		}
	}
	ceiling := math.NaN()
	for _, c := range o.pgbenchCl {
		if v := t.Median(fmt.Sprintf("pgbench saga-step transaction, %d clients", c), "commits/s"); !math.IsNaN(v) && (math.IsNaN(ceiling) || v > ceiling) {
			ceiling = v
		}
	}
	ratio := func(a, b float64) string {
		if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	wmRate := t.Median(wmName, "sagas/s")
	const work = "saga-equivalents/s (steps applied ÷ 4)"
	if bestName != "" {
		t.Note("best runtime configuration: %s — %s sagas/s (median)", bestName, report.Format(best))
		t.Note("ours / Watermill (completed sagas/s): **%s×** (target ≥ 4.5× on one machine, ≥ 8× on separate hosts); by steps applied ÷ 4: %s×",
			ratio(best, wmRate), ratio(t.Median(bestName, work), t.Median(wmName, work)))
		const total = "total CPU ms/saga (client + PostgreSQL + RabbitMQ)"
		t.Note("total CPU per saga: ours %s ms (target ≤ 3.0), Watermill %s ms",
			report.Format(t.Median(bestName, total)), report.Format(t.Median(wmName, total)))
		for _, n := range append(oursNames, wmName) {
			if r := t.Get(n, "% of sagas completed within the limit"); r != nil {
				t.Note("%s: the limit ended %d of %d runs before every saga completed (median %s%% did); the rates are over the window, with at most -inflight sagas under way",
					n, len(r.Values), len(t.Get(n, "sagas/s").Values), report.Format(r.Median()))
			}
		}
		if !math.IsNaN(ceiling) { // the pg group ran
			t.Note("ours / one-commit-per-step ceiling (best pgbench commits/s ÷ %d steps = %s sagas/s): **%s×** (target > 1)",
				workload.Steps, report.Format(ceiling/workload.Steps), ratio(best, ceiling/workload.Steps))
		}
		t.Note("ours commits per step: %s; Watermill: %s",
			report.Format(t.Median(bestName, "commits/step")), report.Format(t.Median(wmName, "commits/step")))
	}
	rawQ := t.Median("publish persistent 300 B, confirms window 256, quorum queue", "msgs/s")
	shaped := t.Median(sameShapeName, "msgs/s")
	keys := make([]string, 0, len(relayNames))
	for k := range relayNames {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := relayNames[k]
		r := t.Median(fmt.Sprintf("%s, %d rows", name, o.relayRows), "msgs/s")
		if !math.IsNaN(r) {
			t.Note("%s / raw publish of the same messages (same shape): **%s** (target ≥ 0.80); / bare raw pipelined-confirm publish to a quorum queue: %s",
				name, ratio(r, shaped), ratio(r, rawQ))
		}
	}
}
