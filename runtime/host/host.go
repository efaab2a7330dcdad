package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry/promexport"
)

// Package is what generated code declares for one Go package of contracts
// (its SagaPackage function): the package's message types and its broker
// topology.
type Package struct {
	// Path is the Go import path of the package.
	Path string
	// Messages are the package's annotated message types.
	Messages []*message.Info
	// Topology returns the package's exchanges, work queues (with tier
	// queues for the policy and parking lots) and bindings.
	Topology func(broker.QueueType, retry.Policy) broker.Topology
}

// Participant is one service's command handling, as a generated
// Register<Service>Participant function adds it.
type Participant struct {
	// Service is the owner the contract names; it scopes the records that
	// make the service's effects happen once per command.
	Service string
	// Queue is the service's command queue.
	Queue string
	// Package declares the service's commands and their replies.
	Package Package
	// Func dispatches a command to the user's implementation.
	Func participant.Func
}

// Saga is one saga type, as a generated Register<Saga> function adds it.
type Saga struct {
	// Engine runs the saga (built from [Host.SagaConfig]).
	Engine *saga.Engine
	// Queue is the saga's queue (replies, events, its start message).
	Queue string
	// Snake is the saga's snake_case name: its HTTP paths are
	// /sagas/<Snake>/.
	Snake string
	// Package declares the saga.
	Package Package
	// Migrations create and evolve the saga's instance table.
	Migrations schema.Source
	// NewStart returns an empty start message (the start endpoint decodes
	// requests into it).
	NewStart func() message.Message
}

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
	metrics *promexport.Exporter // nil when Config.Telemetry has a meter or HTTP is off

	mu           sync.Mutex
	participants []Participant
	sagas        []Saga
	migrations   []schema.Source   // Config.Migrations, then AddMigrations
	queues       map[string]string // queue → who registered it
	regErrs      []error
	state        state
	run          *running // set by Start
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
	h := &Host{cfg: cfg, log: cfg.Logger.With("service", cfg.Service), mux: http.NewServeMux(), queues: map[string]string{},
		migrations: slices.Clone(cfg.Migrations)}
	if cfg.Telemetry.Meter == nil && cfg.HTTPAddr != HTTPOff {
		exp, err := promexport.New(nil)
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", cfg.Service, err)
		}
		h.metrics = exp
		h.cfg.Telemetry.Meter = exp.MeterProvider()
	}
	h.pool = cfg.Pool
	if h.pool == nil {
		pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
		if err != nil {
			return nil, fmt.Errorf("host %s: database URL: %w", cfg.Service, err) // pgx keeps the password out
		}
		if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
			pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.Service
		}
		if h.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
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

// Handle registers an HTTP handler of the service's own on the host's
// server (http.ServeMux patterns). The host's own paths are /healthz,
// /readyz, /metrics, /sagas/ and /admin/.
func (h *Host) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

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
func (h *Host) AddParticipant(p Participant) error {
	var errs []error
	if p.Service == "" || p.Queue == "" || p.Func == nil || p.Package.Topology == nil {
		errs = append(errs, fmt.Errorf("participant %q on queue %q: incomplete registration", p.Service, p.Queue))
	}
	return h.register("participant "+p.Service, p.Queue, errors.Join(errs...), func() { h.participants = append(h.participants, p) })
}

// AddSaga registers a saga. Generated Register<Saga> functions call it.
func (h *Host) AddSaga(s Saga) error {
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
		err := fmt.Errorf("host %s: migrations added after Start", h.cfg.Service)
		h.regErrs = append(h.regErrs, err)
		return err
	}
	h.migrations = append(h.migrations, sources...)
	return nil
}

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
		err = fmt.Errorf("host %s: %w", h.cfg.Service, err)
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
