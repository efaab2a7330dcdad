package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/service"
	"github.com/protosaga/saga/runtime/subscriber"
	"github.com/protosaga/saga/runtime/telemetry"
)

// running is what Start built and Stop tears down.
type running struct {
	pub, sub  *broker.Conn
	relays    []*outbox.Relay
	callbacks *callback.Dispatcher
	consumers []*consumer.Consumer
	server    *http.Server
	listener  net.Listener
	gauges    []metric.Registration

	// work runs the consumers and timeout scanners; relayWork the relays,
	// which stop only after the consumers have drained.
	work, relayWork           context.Context
	stopWork, stopRelays      context.CancelFunc
	wg, consumersWG, relaysWG sync.WaitGroup
	ready                     atomic.Bool

	mu     sync.Mutex
	errs   []error
	failed chan struct{} // closed when a part stops with an error
	once   sync.Once

	stopped chan struct{} // closed when Stop is done; stopErr is its result
	stopErr error
}

// fail records a part's error and asks Run to stop.
func (r *running) fail(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
	r.once.Do(func() { close(r.failed) })
}

// Run starts the host, runs until ctx ends or a part fails, then stops
// everything in order (see [Host.Stop]) and returns the first failure, or
// nil after a clean stop.
func (h *Host) Run(ctx context.Context) error {
	if err := h.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		h.log.Info("stopping", "cause", context.Cause(ctx))
	case <-h.run.failed:
		h.log.Error("a part of the host failed; stopping")
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*h.cfg.DrainTimeout+30*time.Second)
	defer cancel()
	return h.Stop(stopCtx)
}

// Failed returns a channel that is closed when a part of the started host
// stopped with an error (Stop then returns it). Before Start it is nil.
func (h *Host) Failed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.run == nil {
		return nil
	}
	return h.run.failed
}

// Start applies the migrations of everything registered (unless
// Config.SkipMigrations), checks each saga's stored states against its
// definition, connects to the broker (one connection to publish, one to
// consume), declares the merged topology, and starts the relays, the
// consumers, the timeout scanners and the HTTP server. It returns once they
// run; Stop ends them. When Start fails, nothing it started keeps running.
func (h *Host) Start(ctx context.Context) (err error) {
	h.mu.Lock()
	switch {
	case h.state != stateNew:
		h.mu.Unlock()
		return fmt.Errorf("host %s: already started", h.cfg.Service)
	case len(h.regErrs) > 0:
		h.mu.Unlock()
		return fmt.Errorf("host %s: %w", h.cfg.Service, errors.Join(h.regErrs...))
	case len(h.participants) == 0 && len(h.subscribers) == 0 && len(h.sagas) == 0 && h.cfg.Relays == NoRelays:
		h.mu.Unlock()
		return fmt.Errorf("host %s: nothing to run: register a participant, a subscriber or a saga, or run a relay", h.cfg.Service)
	}
	h.state = stateStarting
	h.mu.Unlock()

	r := &running{failed: make(chan struct{}), stopped: make(chan struct{})}
	defer func() {
		if err != nil {
			h.teardown(r)
			if h.metrics != nil {
				_ = h.metrics.Shutdown(context.WithoutCancel(ctx))
			}
			if h.ownPool {
				h.pool.Close()
			}
			h.setState(stateStopped)
			err = fmt.Errorf("host %s: %w", h.cfg.Service, err)
		}
	}()
	if need, have := h.poolNeed(), int(h.pool.Config().MaxConns); need > have {
		h.log.Warn("the database pool may be too small for what is registered: raise pool_max_conns in SAGA_PG_URL (or Config.Pool's MaxConns) or lower SAGA_CONCURRENCY",
			"max_conns", have, "need", need)
	}
	if err := h.prepareDatabase(ctx); err != nil {
		return err
	}
	if err := h.connect(ctx, r); err != nil {
		return err
	}
	if err := h.build(r); err != nil {
		return err
	}
	if err := h.serve(r); err != nil {
		return err
	}
	h.launch(r)
	r.ready.Store(true)
	h.mu.Lock()
	h.run, h.state = r, stateRunning
	h.mu.Unlock()
	h.log.Info("host started", "participants", len(h.participants), "subscribers", len(h.subscribers), "sagas", len(h.sagas),
		"relays", len(r.relays), "http", h.httpAddr(r))
	return nil
}

func (h *Host) setState(s state) {
	h.mu.Lock()
	h.state = s
	h.mu.Unlock()
}

// Migrate applies the migrations of what is registered: the runtime's
// tables, the participants' once records, each saga's instance table and the
// service's own (Config.Migrations, AddMigrations), each once, under
// schema.Migrate's advisory lock. Start does it unless Config.SkipMigrations;
// call it alone for a service's "migrate" command, or before starting sagas
// ahead of Start.
func (h *Host) Migrate(ctx context.Context) error {
	if err := h.migrate(ctx); err != nil {
		return fmt.Errorf("host %s: %w", h.cfg.Service, err)
	}
	return nil
}

func (h *Host) migrate(ctx context.Context) error {
	h.mu.Lock()
	var sources []schema.Source
	if len(h.participants) > 0 {
		sources = append(sources, participant.Migrations)
	}
	for _, s := range h.sagas {
		sources = append(sources, s.Migrations)
	}
	sources = append(sources, h.migrations...)
	h.mu.Unlock()
	return schema.Migrate(ctx, h.pool, sources...) // its errors say "migrate: ..."
}

// prepareDatabase applies the migrations and checks the sagas' states.
func (h *Host) prepareDatabase(ctx context.Context) error {
	if !h.cfg.SkipMigrations {
		if err := h.migrate(ctx); err != nil {
			return err
		}
	}
	for _, s := range h.sagas {
		if err := s.Engine.CheckStates(ctx); err != nil {
			return err
		}
	}
	return nil
}

// build creates the relays and consumers and registers the gauges.
func (h *Host) build(r *running) error {
	for i := 0; i < h.cfg.Relays; i++ {
		rl, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: h.pool, Conn: r.pub, Logger: h.log, Telemetry: h.cfg.Telemetry,
			LeaseDuration: h.cfg.RelayLease, KeepPublished: h.cfg.KeepPublished,
		})
		if err != nil {
			return fmt.Errorf("relay %d: %w", i, err)
		}
		r.relays = append(r.relays, rl)
	}
	if cb := h.cfg.Callbacks; cb != nil {
		cfg := *cb
		if cfg.Pool == nil {
			cfg.Pool = h.pool
		}
		if cfg.Logger == nil {
			cfg.Logger = h.log
		}
		if cfg.Telemetry == (telemetry.Providers{}) {
			cfg.Telemetry = h.cfg.Telemetry
		}
		d, err := callback.NewDispatcher(cfg)
		if err != nil {
			return fmt.Errorf("callback dispatcher: %w", err)
		}
		r.callbacks = d
	}
	add := func(queue string, pkg service.Package, reg *message.Registry, handler consumer.BatchHandler, dedupes bool,
		pruneDedupes func(context.Context, time.Time) (int64, error)) error {
		t := h.cfg.tuning(queue)
		pol := h.cfg.Retry
		if d, ok := pkg.Retry[queue]; ok {
			pol = d // the contract's policy for this queue, which Topology declared
		}
		var relay *outbox.Relay
		if n := len(r.relays); n > 0 {
			// Rows a consumer's batches commit go straight to a relay of
			// this process, without a claim.
			relay = r.relays[len(r.consumers)%n]
		}
		c, err := consumer.New(consumer.Config{
			Name: queue, HandlerDedupes: dedupes, PruneDedupes: pruneDedupes, Queue: queue, Pool: h.pool, Conn: r.sub, PublishConn: r.pub, Registry: reg, Batch: handler, Relay: relay,
			Prefetch: t.Prefetch, Concurrency: t.Concurrency, BatchSize: t.BatchSize, Retry: pol,
			DrainTimeout: h.cfg.DrainTimeout, KeepClaims: h.cfg.KeepClaims,
			Logger: h.log, Telemetry: h.cfg.Telemetry,
		})
		if err != nil {
			return fmt.Errorf("consumer of %s: %w", queue, err)
		}
		r.consumers = append(r.consumers, c)
		return nil
	}
	for _, p := range h.participants {
		reg, err := message.NewRegistry(p.Package.Messages...)
		if err != nil {
			return fmt.Errorf("participant %s: %w", p.Service, err)
		}
		fn := participant.Idempotent(p.Service, reg, p.Func)
		if h.cfg.ParticipantMiddleware != nil {
			fn = h.cfg.ParticipantMiddleware(p.Service, fn)
		}
		// Idempotent's once record names the message id it ran as and
		// drops a redelivery of it, so the queue needs no inbox claim
		// (runtime/participant); the consumer prunes the service's once
		// records with its claims.
		svc := p.Service
		pruneOnce := func(ctx context.Context, olderThan time.Time) (int64, error) {
			return participant.PruneOnce(ctx, h.pool, svc, olderThan)
		}
		if err := add(p.Queue, p.Package, reg, participant.BatchHandler(p.Service, fn), true, pruneOnce); err != nil {
			return err
		}
	}
	for _, s := range h.subscribers {
		reg, err := message.NewRegistry(s.Package.Messages...)
		if err != nil {
			return fmt.Errorf("subscriber %s: %w", s.Service, err)
		}
		if err := add(s.Queue, s.Package, reg, subscriber.Handler(s.Service, s.Func), false, nil); err != nil {
			return err
		}
	}
	for _, s := range h.sagas {
		// The engine drops a redelivery by the instance it moved, and
		// claims in the inbox only what it did not apply as new
		// (runtime/saga, Engine.Handle).
		if err := add(s.Queue, s.Package, s.Engine.Registry(), s.Engine, true, nil); err != nil {
			return err
		}
	}
	return h.registerGauges(r)
}

// registerGauges registers the database-backed gauges (sagas by state,
// stuck sagas, outbox backlog) when metrics are on.
func (h *Host) registerGauges(r *running) error {
	if h.cfg.Telemetry.Meter == nil {
		return nil
	}
	meter := h.cfg.Telemetry.Meter.Meter(telemetry.ScopeName)
	var defs []*sagadef.Definition
	for _, s := range h.sagas {
		defs = append(defs, s.Engine.Definition())
	}
	if len(defs) > 0 {
		reg, err := saga.RegisterGauges(meter, h.pool, defs)
		if err != nil {
			return fmt.Errorf("saga gauges: %w", err)
		}
		r.gauges = append(r.gauges, reg)
	}
	reg, err := outbox.RegisterGauges(meter, h.pool)
	if err != nil {
		return fmt.Errorf("outbox gauges: %w", err)
	}
	r.gauges = append(r.gauges, reg)
	return nil
}

// launch starts every part in the background.
func (h *Host) launch(r *running) {
	r.work, r.stopWork = context.WithCancel(context.Background())
	r.relayWork, r.stopRelays = context.WithCancel(context.Background())
	part := func(name string, wg *sync.WaitGroup, f func() error) {
		r.wg.Add(1)
		if wg != nil {
			wg.Add(1)
		}
		go func() {
			defer r.wg.Done()
			if wg != nil {
				defer wg.Done()
			}
			if err := f(); err != nil && !errors.Is(err, context.Canceled) {
				r.fail(fmt.Errorf("%s: %w", name, err))
			}
		}()
	}
	for i, rl := range r.relays {
		part(fmt.Sprintf("relay %d", i), &r.relaysWG, func() error { return rl.Run(r.relayWork) })
	}
	if d := r.callbacks; d != nil {
		part("callback dispatcher", &r.relaysWG, func() error { return d.Run(r.relayWork) })
	}
	if len(r.relays) > 0 {
		part("outbox scheduler", &r.relaysWG, func() error {
			return outbox.RunScheduler(r.relayWork, outbox.SchedulerConfig{Pool: h.pool, Now: h.cfg.Now, Logger: h.log})
		})
	}
	for _, c := range r.consumers {
		part("consumer", &r.consumersWG, func() error { return c.Run(r.work) })
	}
	if len(r.relays) > 0 {
		// The engines' own transactions (starts, operator actions, the
		// timeout scanner) hand their rows to a relay of this process.
		for _, s := range h.sagas {
			s.Engine.HandOffTo(r.relays[0])
		}
	}
	for _, s := range h.sagas {
		part("timeout scanner of "+s.Engine.Definition().Name, nil, func() error {
			return s.Engine.RunTimeouts(r.work, h.cfg.TimeoutScanInterval)
		})
	}
	if h.cfg.AdminTokensFile != "" && h.admin != nil {
		part("admin tokens watcher", nil, func() error { return h.watchTokens(r.work) })
	}
	if r.server != nil {
		part("HTTP server", nil, func() error {
			if err := r.server.Serve(r.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
}

// Stop stops a started host in order: readiness turns false, consumers stop
// taking deliveries and drain (Config.DrainTimeout) and the timeout scanners
// stop, then the relays publish what the consumers handed them and stop,
// then the HTTP server shuts down and the broker connections and (when the
// host opened it) the pool close. It returns the errors parts stopped with,
// or ctx's error when ctx ends before they have stopped.
func (h *Host) Stop(ctx context.Context) error {
	h.mu.Lock()
	r := h.run
	switch h.state {
	case stateRunning:
		h.state = stateStopping
		h.mu.Unlock()
		r.stopErr = h.stop(ctx, r)
		close(r.stopped)
		return r.stopErr
	case stateStopping, stateStopped:
		h.mu.Unlock()
		if r == nil {
			return nil // never started
		}
		select { // another Stop is at work: wait for its result
		case <-r.stopped:
			return r.stopErr
		case <-ctx.Done():
			return fmt.Errorf("host %s: waiting for another Stop: %w", h.cfg.Service, ctx.Err())
		}
	default:
		h.mu.Unlock()
		return fmt.Errorf("host %s: not running", h.cfg.Service)
	}
}

// stop does Stop's work, once.
func (h *Host) stop(ctx context.Context, r *running) error {
	r.ready.Store(false)
	r.stopWork()
	var errs []error
	drained := true
	if err := wait(ctx, &r.consumersWG); err != nil {
		drained = false
		errs = append(errs, fmt.Errorf("consumers did not drain: %w", err))
	}
	for _, s := range h.sagas {
		s.Engine.HandOffTo(nil)
	}
	r.stopRelays()
	if err := wait(ctx, &r.relaysWG); err != nil {
		drained = false
		errs = append(errs, fmt.Errorf("relays did not stop: %w", err))
	}
	if r.server != nil {
		if err := r.server.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("HTTP server shutdown: %w", err))
		}
	}
	if err := wait(ctx, &r.wg); err != nil {
		drained = false
		errs = append(errs, fmt.Errorf("parts did not stop: %w", err))
	}
	h.teardown(r)
	if h.metrics != nil {
		if err := h.metrics.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if h.tracer != nil {
		if err := h.tracer.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tracer shutdown: %w", err))
		}
	}
	if h.ownPool {
		if drained {
			h.pool.Close()
		} else {
			// Parts that did not stop still hold connections, and Close
			// waits for them: do not hold Stop past its context for it.
			go h.pool.Close()
		}
	}
	h.setState(stateStopped)
	r.mu.Lock()
	errs = append(slices.Clone(r.errs), errs...)
	r.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("host %s: %w", h.cfg.Service, errors.Join(errs...))
	}
	h.log.Info("host stopped")
	return nil
}

// teardown releases what Start built; the parts have stopped (or never
// started).
func (h *Host) teardown(r *running) {
	for _, g := range r.gauges {
		_ = g.Unregister()
	}
	if r.callbacks != nil {
		_ = r.callbacks.Close()
	}
	if r.listener != nil && r.server == nil {
		_ = r.listener.Close()
	}
	for _, c := range []*broker.Conn{r.sub, r.pub} {
		if c != nil {
			_ = c.Close()
		}
	}
	if r.stopWork != nil {
		r.stopWork()
		r.stopRelays()
	}
}

// wait waits for wg or ctx, whichever comes first.
func wait(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RelayStats sums the counters of the host's relays.
func (h *Host) RelayStats() outbox.RelayStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s outbox.RelayStats
	if h.run == nil {
		return s
	}
	for _, r := range h.run.relays {
		rs := r.Stats()
		s.Published += rs.Published
		s.Failed += rs.Failed
		s.HandedOff += rs.HandedOff
		s.Pruned += rs.Pruned
		s.Orphans += rs.Orphans
	}
	return s
}
