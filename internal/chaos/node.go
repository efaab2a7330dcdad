package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// Lines of the node protocol: a node writes them on its standard output and
// the driver reads them.
const (
	// LineReady "READY <pid>": the node migrated, declared its topology and
	// runs its roles.
	LineReady = "READY"
	// LineCrash "CRASH <point>": the node stands at an armed crash point and
	// waits to be killed.
	LineCrash = "CRASH"
	// LineFault "FAULT <kind>": the node injected a participant fault.
	LineFault = "FAULT"
)

// NodeConfig configures one node process: the Place Order application
// running some of its roles.
type NodeConfig struct {
	// Name identifies the node in logs and relay lease owners.
	Name string
	// PostgresURL and AMQPURL locate the database (with its search_path) and
	// the vhost.
	PostgresURL, AMQPURL string
	// Roles are the parts of the application the node runs.
	Roles []Role
	// Crash arms crash points (point → passage that fires it).
	Crash map[CrashPoint]int
	// Faults are the participant faults to inject (Observe is set by the
	// node).
	Faults Faults
	// StepTimeout overrides every step's timeout; zero keeps the contract's.
	StepTimeout time.Duration
	// RelayLease is the relays' outbox lease.
	RelayLease time.Duration
	// Retry is the consumers' retry policy.
	Retry retry.Policy
	// Concurrency and BatchSize tune the consumers.
	Concurrency, BatchSize int
	// CallbackKeys, when set, is the signing key of the callback
	// dispatcher every relay node runs ("ID:SECRET"). It goes to the node
	// in its environment (callback.EnvKeys), not on its command line.
	CallbackKeys string
	// KillWait bounds how long a node stands at a crash point waiting for
	// the driver's SIGKILL before it kills itself; default 10 s.
	KillWait time.Duration
}

// Steps are the Place Order saga's steps, for StepTimeout.
var Steps = []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ApproveOrder"}

// TripSteps are the Book Trip saga's steps, and PaymentSteps its child
// Payment's, for StepTimeout.
var (
	TripSteps    = []string{"ValidateTraveller", "ReserveFlight", "ReserveHotel", "ReserveCar", "BuyInsurance", "ChargeTrip", "ConfirmTrip"}
	PaymentSteps = []string{"AuthorizeCard", "ScreenPayment", "CaptureFunds"}
)

// childStep is Book Trip's step that waits for the child Payment; it
// waits as long as the child's three steps may take, resends included.
const childStep = "ChargeTrip"

// stepTimeouts maps every step of the sagas to d, by saga name, and the
// child step to what its child may take.
func stepTimeouts(d time.Duration) map[string]map[string]time.Duration {
	out := map[string]map[string]time.Duration{}
	for name, steps := range map[string][]string{
		orderv1.PlaceOrderDefinition().Name: Steps, tripv1.BookTripDefinition().Name: TripSteps,
		paymentv1.PaymentDefinition().Name: PaymentSteps,
	} {
		out[name] = map[string]time.Duration{}
		for _, s := range steps {
			out[name][s] = d
		}
	}
	out[tripv1.BookTripDefinition().Name][childStep] = 6 * d
	return out
}

// lineWriter serializes protocol lines from concurrent goroutines.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}

// RunNode runs a node until ctx is cancelled (the driver sends SIGTERM),
// writing protocol lines to out and logs to logw. Startup is retried while
// the database or the broker is down (a node restarted in the middle of a
// server restart waits for it).
func RunNode(ctx context.Context, cfg NodeConfig, out, logw io.Writer) error {
	lw := &lineWriter{w: out}
	logger := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", cfg.Name)
	if cfg.KillWait <= 0 {
		cfg.KillWait = 10 * time.Second
	}
	crashes := NewCrashes(func(p CrashPoint) {
		lw.line("%s %s", LineCrash, p)
		time.Sleep(cfg.KillWait)
		logger.Error("crash point not killed by the driver; killing myself", "point", p)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}, cfg.Crash)

	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return fmt.Errorf("node %s: parse database URL: %w", cfg.Name, err)
	}
	pcfg.ConnConfig.Tracer = crashes.Tracer()
	pcfg.MaxConns = 24
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("node %s: open pool: %w", cfg.Name, err)
	}
	defer pool.Close()

	if err := cfg.Faults.Validate(); err != nil {
		return fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	faults := newInjector(cfg.Faults)
	faults.Observe = func(kind string) { lw.line("%s %s", LineFault, kind) }
	hcfg := host.Config{
		Service:             cfg.Name,
		Pool:                pool,
		AMQPURL:             cfg.AMQPURL,
		HTTPAddr:            host.HTTPOff,
		Relays:              host.NoRelays,
		Concurrency:         cfg.Concurrency,
		BatchSize:           cfg.BatchSize,
		Retry:               cfg.Retry,
		TimeoutScanInterval: 250 * time.Millisecond,
		DrainTimeout:        10 * time.Second,
		RelayLease:          cfg.RelayLease,
		Logger:              logger,
		ParticipantMiddleware: func(service string, next participant.Func) participant.Func {
			return faults.Middleware(service, crashes.Middleware(service, next))
		},
	}
	if slices.Contains(cfg.Roles, RoleRelay) {
		hcfg.Relays = 1
		// Relay nodes dispatch the callbacks too, to the driver's receiver
		// on loopback; short waits and leases, so that a killed node's
		// deliveries are taken over within the run.
		cb, err := callback.FromEnv(os.Getenv)
		if err != nil {
			return fmt.Errorf("node %s: %w", cfg.Name, err)
		}
		if cb != nil {
			cb.AllowPrivate.Loopback = true
			cb.Timeout, cb.Lease = 2*time.Second, 5*time.Second
			cb.MinBackoff, cb.MaxBackoff = 100*time.Millisecond, 2*time.Second
			cb.MaxAttempts, cb.MaxAge = 1000, time.Hour
			hcfg.Callbacks = cb
		}
	}
	if cfg.StepTimeout > 0 {
		hcfg.StepTimeouts = stepTimeouts(cfg.StepTimeout)
	}
	var h *host.Host
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err = startNode(ctx, hcfg, cfg.Roles)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: %w", cfg.Name, err)
		}
		logger.Warn("node cannot start yet; retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	slowCtx, stopSlow := context.WithCancel(ctx)
	defer stopSlow()
	go func() { _ = faults.runSlowReplies(slowCtx, pool, logger) }()
	lw.line("%s %d", LineReady, os.Getpid())
	select {
	case <-ctx.Done():
	case <-h.Failed():
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := h.Stop(stopCtx); err != nil {
		return fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	return nil
}

// startNode builds and starts a host running roles.
func startNode(ctx context.Context, cfg host.Config, roles []Role) (*host.Host, error) {
	h, err := host.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := register(h, roles); err != nil {
		h.Close()
		return nil, err
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// Args renders cfg as the soak binary's node flags (see ParseNodeArgs).
func (cfg NodeConfig) Args() []string {
	roles := make([]string, len(cfg.Roles))
	for i, r := range cfg.Roles {
		roles[i] = string(r)
	}
	var crash []string
	for p, n := range cfg.Crash {
		crash = append(crash, fmt.Sprintf("%s:%d", p, n))
	}
	tiers := make([]string, len(cfg.Retry.Tiers))
	for i, t := range cfg.Retry.Tiers {
		tiers[i] = t.String()
	}
	return []string{
		"-name", cfg.Name,
		"-pg", cfg.PostgresURL,
		"-amqp", cfg.AMQPURL,
		"-roles", strings.Join(roles, ","),
		"-crash", strings.Join(crash, ","),
		"-seed", fmt.Sprint(cfg.Faults.Seed),
		"-transient", fmt.Sprint(cfg.Faults.Transient),
		"-slow", fmt.Sprint(cfg.Faults.Slow),
		"-slow-delay", cfg.Faults.SlowDelay.String(),
		"-duplicate", fmt.Sprint(cfg.Faults.Duplicate),
		"-step-timeout", cfg.StepTimeout.String(),
		"-relay-lease", cfg.RelayLease.String(),
		"-retry-tiers", strings.Join(tiers, ","),
		"-retry-attempts", fmt.Sprint(cfg.Retry.MaxAttempts),
		"-concurrency", fmt.Sprint(cfg.Concurrency),
		"-batch", fmt.Sprint(cfg.BatchSize),
	}
}

// ParseNodeArgs parses the node flags that NodeConfig.Args renders.
func ParseNodeArgs(args []string) (NodeConfig, error) {
	var cfg NodeConfig
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var roles, crash, tiers string
	fs.StringVar(&cfg.Name, "name", "node", "node name")
	fs.StringVar(&cfg.PostgresURL, "pg", "", "PostgreSQL URL (with search_path)")
	fs.StringVar(&cfg.AMQPURL, "amqp", "", "AMQP URL (with vhost)")
	fs.StringVar(&roles, "roles", "all", "roles: relay, orchestrator, a participant service (inventory, payment, shipping, order, travellers, flights, hotels, cars, insurance, cards, fraud, trip, itinerary, notifications), participants, all")
	fs.StringVar(&crash, "crash", "", "armed crash points, point:n,...")
	fs.Uint64Var(&cfg.Faults.Seed, "seed", 1, "fault seed")
	fs.Float64Var(&cfg.Faults.Transient, "transient", 0, "probability of a transient failure per delivery")
	fs.Float64Var(&cfg.Faults.Slow, "slow", 0, "probability of a held-back reply per command")
	fs.DurationVar(&cfg.Faults.SlowDelay, "slow-delay", 0, "delay of held-back replies")
	fs.Float64Var(&cfg.Faults.Duplicate, "duplicate", 0, "probability of a duplicate reply per command")
	fs.DurationVar(&cfg.StepTimeout, "step-timeout", 0, "every step's timeout (0: the contract's)")
	fs.DurationVar(&cfg.RelayLease, "relay-lease", 0, "relay lease (0: the relay's default)")
	fs.StringVar(&tiers, "retry-tiers", "", "retry tier TTLs, comma-separated (empty: the default policy)")
	fs.IntVar(&cfg.Retry.MaxAttempts, "retry-attempts", 0, "deliveries before parking")
	fs.IntVar(&cfg.Concurrency, "concurrency", 0, "consumer workers")
	fs.IntVar(&cfg.BatchSize, "batch", 0, "consumer batch size")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var err error
	if cfg.Roles, err = ParseRoles(roles); err != nil {
		return cfg, err
	}
	if cfg.Crash, err = ParseCrashArm(crash); err != nil {
		return cfg, err
	}
	for t := range strings.SplitSeq(tiers, ",") {
		if t == "" {
			continue
		}
		d, err := time.ParseDuration(t)
		if err != nil {
			return cfg, fmt.Errorf("retry tier %q: %w", t, err)
		}
		cfg.Retry.Tiers = append(cfg.Retry.Tiers, d)
	}
	if len(cfg.Retry.Tiers) == 0 {
		cfg.Retry = retry.Policy{}
	}
	if cfg.PostgresURL == "" || cfg.AMQPURL == "" {
		return cfg, errors.New("-pg and -amqp are required")
	}
	return cfg, nil
}
