// Command soak is the chaos soak of the Place Order and travel examples
// (internal/chaos).
//
//	soak [flags]        drive a run: start a fleet of node processes (this
//	                    binary, in node mode), start sagas while participants
//	                    fail at random, kill nodes at crash points and at
//	                    random, restart RabbitMQ and PostgreSQL, then check
//	                    every invariant and print the report
//	soak node [flags]   run one node: the examples' services and sagas, some
//	                    roles of them (the driver starts these)
//
// The driver starts private servers with scripts/services.sh unless
// -services names a directory of running ones (which it restarts: share
// them with nothing else). With -cluster N they are a RabbitMQ cluster of N
// nodes (services.sh cluster-start), whose node leading the queues is
// killed -node-kills times instead of restarting the broker. With -replica
// sync (or async) PostgreSQL has a streaming replica (services.sh
// replica-start), promoted mid-run after the primary crashes, instead of
// PostgreSQL restarts. Run it from the repository root, or through
// `make soak`. The exit status is 1 when an invariant is broken.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/protosaga/saga/internal/chaos"
	"github.com/protosaga/saga/internal/testenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "node" {
		cfg, err := chaos.ParseNodeArgs(os.Args[2:])
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak node:", err)
			os.Exit(2)
		}
		if err := chaos.RunNode(ctx, cfg, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(drive(ctx))
}

func drive(ctx context.Context) int {
	var (
		cfg      chaos.Config
		runs     int
		services string
		load     bool
		cluster  int
		replica  string
		measure  string
	)
	flag.IntVar(&runs, "runs", 1, "soak runs, one after another (fresh schema and vhost each)")
	flag.StringVar(&services, "services", "", "directory of running services (scripts/services.sh); empty: start private ones")
	flag.BoolVar(&load, "load", false, "sustained-load run: no kills or restarts, RSS sampled and checked for growth")
	var tripShare float64
	flag.IntVar(&cfg.Sagas, "sagas", 2000, "Place Order sagas per run")
	flag.Float64Var(&tripShare, "trips", 0.5, "Book Trip sagas (the travel example) per run, started alongside, as a share of -sagas")
	flag.Float64Var(&cfg.Rate, "rate", 40, "sagas started per second (Place Order and Book Trip together)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed (0: from the clock; run i uses seed+i)")
	flag.IntVar(&cfg.Relays, "relays", 2, "relay processes")
	flag.IntVar(&cfg.Orchestrators, "orchestrators", 2, "orchestrator processes")
	flag.IntVar(&cfg.Participants, "participants", 3, "participant processes (every participant service of both examples each)")
	flag.DurationVar(&cfg.KillEvery, "kill-every", 6*time.Second, "mean interval between random SIGKILLs (0: none)")
	flag.Float64Var(&cfg.Rearm, "rearm", 0.3, "probability that a restarted node is armed at a crash point again")
	flag.IntVar(&cfg.BrokerRestarts, "broker-restarts", 2, "RabbitMQ restarts per run")
	flag.IntVar(&cfg.PostgresRestarts, "postgres-restarts", 2, "PostgreSQL restarts per run")
	flag.IntVar(&cluster, "cluster", 0, "run on a RabbitMQ cluster of this many nodes (0: one node)")
	flag.IntVar(&cfg.NodeKills, "node-kills", 2, "with -cluster: SIGKILLs of the node leading the queues per run (each brought back after -node-down)")
	flag.DurationVar(&cfg.NodeDown, "node-down", 10*time.Second, "with -cluster: how long a killed node stays down")
	flag.StringVar(&measure, "measure-failover", "", "sync or async: instead of a soak, measure what a failover of a PostgreSQL with a replica of that kind loses (chaos.MeasureFailover), -runs times")
	flag.StringVar(&replica, "replica", "", "sync or async: run on a PostgreSQL with a streaming replica of that kind, crash the primary and promote the replica mid-run (instead of PostgreSQL restarts)")
	flag.Float64Var(&cfg.Transient, "transient", 0.08, "probability of a transient failure per delivery")
	flag.Float64Var(&cfg.Slow, "slow", 0.03, "probability of a reply held back past the step timeout")
	flag.Float64Var(&cfg.Duplicate, "duplicate", 0.05, "probability of a duplicate reply")
	flag.Float64Var(&cfg.DeclinedShare, "declined", 0.08, "share of orders and trips paid with a declined card")
	flag.Float64Var(&cfg.SoldOutShare, "sold-out", 0.08, "share of orders with a product out of stock, and of trips on a sold-out flight")
	flag.Float64Var(&cfg.RejectedShare, "rejected", 0.05, "share of trips whose traveller's passport is expired")
	flag.Float64Var(&cfg.NoPermitShare, "no-permit", 0.05, "share of trips whose traveller is refused an entry permit")
	flag.DurationVar(&cfg.StepTimeout, "step-timeout", 15*time.Second, "every step's timeout (one shorter than a broker restart sends most sagas in flight to manual review)")
	flag.DurationVar(&cfg.SettleTimeout, "settle", 4*time.Minute, "bound on the wait for the fleet to settle")
	flag.DurationVar(&cfg.SampleRSS, "sample-rss", 2*time.Second, "RSS sampling interval (0: none)")
	flag.Float64Var(&cfg.MaxRSSGrowth, "max-rss-growth", 0, "fail when a long-lived node's RSS grows by more than this factor (0: report only; -load defaults to 1.5)")
	flag.StringVar(&cfg.LogDir, "logs", "", "node log directory (default: a temporary one, removed when the run passes)")
	flag.Parse()
	cfg.Trips = int(float64(cfg.Sagas) * tripShare)
	cfg.CrashPoints = true
	cfg.Log = os.Stderr
	if load {
		cfg.KillEvery, cfg.BrokerRestarts, cfg.PostgresRestarts, cfg.CrashPoints = 0, 0, 0, false
		if cfg.MaxRSSGrowth == 0 {
			cfg.MaxRSSGrowth = 1.5
		}
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cluster == 0 {
		cfg.NodeKills = 0
	} else {
		cfg.BrokerRestarts = 0 // a cluster loses nodes instead
	}
	if measure != "" {
		return measureFailover(ctx, runs, measure)
	}
	if replica != "" {
		if cluster > 0 {
			fmt.Fprintln(os.Stderr, "soak: -cluster and -replica are separate runs")
			return 2
		}
		cfg.Failover, cfg.PostgresRestarts = true, 0 // the primary fails over instead
	}

	var svc *testenv.Services
	var err error
	if services != "" {
		svc, err = testenv.LoadServices(services)
	} else {
		dir, derr := os.MkdirTemp("", "saga-soak-services-")
		if derr != nil {
			fmt.Fprintln(os.Stderr, "soak:", derr)
			return 1
		}
		_ = os.Chmod(dir, 0o755)
		switch {
		case cluster > 0:
			fmt.Fprintf(os.Stderr, "soak: starting a private PostgreSQL and a RabbitMQ cluster of %d nodes in %s\n", cluster, dir)
			svc, err = testenv.StartCluster(ctx, dir, cluster)
		case replica != "":
			fmt.Fprintf(os.Stderr, "soak: starting a private RabbitMQ and a PostgreSQL with a %s replica in %s\n", replica, dir)
			svc, err = testenv.StartReplicated(ctx, dir, replica)
		default:
			fmt.Fprintf(os.Stderr, "soak: starting private PostgreSQL and RabbitMQ in %s\n", dir)
			svc, err = testenv.StartServices(ctx, dir)
		}
		if svc != nil {
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_ = svc.Stop(sctx)
			}()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	cfg.Services = svc
	cfg.Bin, err = os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}

	passed := 0
	seed := cfg.Seed
	for i := range runs {
		cfg.Seed = seed + uint64(i)
		rep, err := chaos.Run(ctx, cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "soak: run %d: %v\n", i+1, err)
			return 1
		}
		fmt.Printf("=== run %d/%d\n%s\n", i+1, runs, rep)
		if len(rep.Violations) == 0 {
			passed++
		}
	}
	fmt.Printf("=== %d of %d runs passed\n", passed, runs)
	if passed != runs {
		return 1
	}
	return 0
}

// measureFailover runs chaos.MeasureFailover runs times, each on a fresh
// PostgreSQL with a replica of the given mode, and prints what each lost.
func measureFailover(ctx context.Context, runs int, mode string) int {
	for i := range runs {
		dir, err := os.MkdirTemp("", "saga-failover-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		_ = os.Chmod(dir, 0o755)
		svc, err := testenv.StartReplicated(ctx, dir, mode)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		loss, err := chaos.MeasureFailover(ctx, svc, 4, 20*time.Second)
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = svc.Stop(sctx)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		_ = os.RemoveAll(dir)
		fmt.Printf("failover %d/%d (%s replica): %d commits acknowledged, %d lost; replay lag before the crash %s; longest time without a commit %s\n",
			i+1, runs, mode, loss.Acknowledged, loss.Missing, loss.Lag, loss.Outage.Round(time.Millisecond))
	}
	return 0
}
