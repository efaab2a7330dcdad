package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/service"
	"github.com/protosaga/saga/runtime/telemetry"
	"github.com/protosaga/saga/runtime/telemetry/promexport"
)

// Host runs a service's part of the sagas in one process: the consumers of
// every registered participant and saga, the outbox relays, each saga's
// timeout scanner, and an HTTP server with health, readiness, metrics, saga
// status and the admin API and console. It applies the migrations and
// declares the topology of what is registered, and stops everything in
// order: consumers drain first, then the relays publish what they handed
// over, then the HTTP server and the connections close.
//
// Build one with [New], register generated participants and sagas
// (Register<Service>Participant, Register<Saga>), then [Host.Run] — or use
// [Main], which does all of it from the environment.
type Host struct {
	cfg     Config
	pool    *pgxpool.Pool
	ownPool bool
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *promexport.Exporter     // nil when Config.Telemetry has a meter or HTTP is off
	tracer  *sdktrace.TracerProvider // the id-only tracer, nil when Config.Telemetry has one
	admin   *admin.Server            // nil without admin tokens (set by Start)

	mu           sync.Mutex
	participants []service.Participant
	subscribers  []service.Subscriber
	sagas        []service.Saga
	migrations   []schema.Source   // Config.Migrations, then AddMigrations
	queues       map[string]string // queue → who registered it
	regErrs      []error
	state        state
	run          *running // set by Start
	tokensRead   []byte   // the admin tokens file as last read, for the watcher
}

type state int

const (
	stateNew state = iota
	stateStarting
	stateRunning
	stateStopping
	stateStopped
)

// New returns a host for cfg. It opens the database pool (connections are
// made when first used) and does no other I/O; Start connects to the
// broker.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("host %s: %w", cfg.Service, err)
	}
	var tokensRead []byte
	if cfg.AdminTokensFile != "" {
		t, raw, err := readTokens(cfg.AdminTokensFile)
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", cfg.Service, err)
		}
		cfg.AdminTokens, tokensRead = t, raw
	}
	h := &Host{cfg: cfg, log: cfg.Logger.With("service", cfg.Service), mux: http.NewServeMux(), queues: map[string]string{},
		migrations: slices.Clone(cfg.Migrations), tokensRead: tokensRead}
	if cfg.Telemetry.Meter == nil && cfg.HTTPAddr != HTTPOff {
		res, err := promexport.ServiceResource(cfg.Service)
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", cfg.Service, err)
		}
		exp, err := promexport.New(res)
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", cfg.Service, err)
		}
		h.metrics = exp
		h.cfg.Telemetry.Meter = exp.MeterProvider()
	}
	if cfg.Telemetry.Tracer == nil {
		// Spans sampled never are recorded nowhere, but each has a valid
		// trace id, which messages carry and log lines name.
		h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		h.cfg.Telemetry.Tracer = h.tracer
	}
	h.pool = cfg.Pool
	if h.pool == nil {
		pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
		if err != nil {
			if h.metrics != nil {
				_ = h.metrics.Shutdown(ctx)
			}
			return nil, fmt.Errorf("host %s: database URL: %w", cfg.Service, err) // pgx keeps the password out
		}
		if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
			pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.Service
		}
		if !strings.Contains(cfg.PostgresURL, "pool_max_conns") {
			pcfg.MaxConns = defaultPoolSize(&cfg)
		}
		if h.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			if h.metrics != nil {
				_ = h.metrics.Shutdown(ctx)
			}
			return nil, fmt.Errorf("host %s: open database pool: %w", cfg.Service, err)
		}
		h.ownPool = true
	}
	return h, nil
}

// Pool returns the host's database pool, for the service's own queries and
// for StartTx in the service's transactions.
func (h *Host) Pool() *pgxpool.Pool { return h.pool }

// Logger returns the host's logger.
func (h *Host) Logger() *slog.Logger { return h.log }

// Telemetry returns the host's tracer and meter providers, for the
// service's own instrumented components (a lock.Locker, for one).
func (h *Host) Telemetry() telemetry.Providers { return h.cfg.Telemetry }

// Handle registers an HTTP handler of the service's own on the host's
// server (http.ServeMux patterns). The host's own paths are /healthz,
// /readyz, /metrics, /sagas/<saga> and /admin/: a pattern that conflicts
// with one, or with an earlier Handle, is refused here or at Start. With the
// HTTP server off, Handle refuses.
func (h *Host) Handle(pattern string, handler http.Handler) error {
	if h.cfg.HTTPAddr == HTTPOff {
		return h.Fail(fmt.Errorf("HTTP route %q: the host's HTTP server is off (%s)", pattern, EnvHTTPAddr))
	}
	if err := h.handle(pattern, handler); err != nil {
		return h.Fail(err)
	}
	return nil
}

// SagaConfig returns the engine configuration the host gives saga fullName:
// its pool, clock, logger, telemetry and step timeouts. Generated
// Register<Saga> functions build their engine from it.
func (h *Host) SagaConfig(fullName string) saga.Config {
	return saga.Config{
		Pool:         h.pool,
		Now:          h.cfg.Now,
		Logger:       h.log,
		Telemetry:    h.cfg.Telemetry,
		StepTimeouts: h.cfg.StepTimeouts[fullName],
	}
}

// AddParticipant registers a participant. Its commands are handled once
// per command type and idempotency key (participant.Idempotent): a command
// resent with a new message id gets the first reply again and has no second
// effect. Generated Register<Service>Participant functions call it.
func (h *Host) AddParticipant(p service.Participant) error {
	var errs []error
	if p.Service == "" || p.Queue == "" || p.Func == nil || p.Package.Topology == nil {
		errs = append(errs, fmt.Errorf("participant %q on queue %q: incomplete registration", p.Service, p.Queue))
	}
	return h.register("participant "+p.Service, p.Queue, errors.Join(errs...), func() { h.participants = append(h.participants, p) })
}

// AddSubscriber registers an event subscriber: the host consumes its
// queue and runs each event once per message id in the consumer's
// transaction (subscriber.Handler). Generated Register<Service>Subscriber
// functions call it.
func (h *Host) AddSubscriber(s service.Subscriber) error {
	var err error
	if s.Service == "" || s.Queue == "" || s.Func == nil || s.Package.Topology == nil {
		err = fmt.Errorf("subscriber %q on queue %q: incomplete registration", s.Service, s.Queue)
	}
	return h.register("subscriber "+s.Service, s.Queue, err, func() { h.subscribers = append(h.subscribers, s) })
}

// AddSaga registers a saga. Generated Register<Saga> functions call it.
func (h *Host) AddSaga(s service.Saga) error {
	var err error
	if s.Engine == nil || s.Queue == "" || s.Snake == "" || s.Package.Topology == nil || s.NewStart == nil {
		err = fmt.Errorf("saga on queue %q: incomplete registration", s.Queue)
	}
	name := "saga"
	if s.Engine != nil {
		name += " " + s.Engine.Definition().Name
	}
	return h.register(name, s.Queue, err, func() { h.sagas = append(h.sagas, s) })
}

// AddMigrations adds the service's own migrations (its tables), applied at
// Start after the runtime's and the sagas'.
func (h *Host) AddMigrations(sources ...schema.Source) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateNew {
		err := errors.New("migrations added after Start")
		h.regErrs = append(h.regErrs, err)
		return err
	}
	h.migrations = append(h.migrations, sources...)
	return nil
}

// Fail records a registration that could not be made, so that Start
// refuses to run, and returns err. Generated Register functions call it.
func (h *Host) Fail(err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.regErrs = append(h.regErrs, err)
	return err
}

var _ service.Registrar = (*Host)(nil)

// register records one registration under h.mu; an error is also kept for
// Start, so a registration whose error the caller dropped still stops it.
func (h *Host) register(who, queue string, err error, add func()) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil && h.state != stateNew {
		err = fmt.Errorf("%s: registered after Start", who)
	}
	if err == nil {
		if prev, ok := h.queues[queue]; ok {
			err = fmt.Errorf("%s: queue %s is already consumed by %s", who, queue, prev)
		}
	}
	if err != nil {
		h.regErrs = append(h.regErrs, err)
		return err
	}
	h.queues[queue] = who
	add()
	return nil
}

// Close releases a host that was never started (its pool, when the host
// opened it). A started host is released by Stop.
func (h *Host) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateNew {
		return
	}
	h.state = stateStopped
	if h.ownPool {
		h.pool.Close()
	}
}

// defaultPoolSize sizes a pool the host opens itself (its URL names no
// pool_max_conns): 4 connections per relay and, per consumer, its workers
// plus one, for eight consumers, plus 4 for starts, reads and gauges.
func defaultPoolSize(c *Config) int32 {
	workers := c.Concurrency
	if workers == 0 {
		workers = 4
	}
	return int32(4*max(c.Relays, 0) + 8*(workers+1) + 4)
}

// poolNeed is what the registered parts need at most at once; Start warns
// when the pool is smaller.
func (h *Host) poolNeed() int {
	n := 4*max(h.cfg.Relays, 0) + 4
	for q := range h.queues {
		w := h.cfg.tuning(q).Concurrency
		if w == 0 {
			w = 4
		}
		n += w + 1
	}
	return n
}
