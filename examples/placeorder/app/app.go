package app

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations holds the example services' own tables (stock, reservations,
// authorizations, shipments, approvals and the shop_ledger journal).
func Migrations() schema.Source {
	sub, _ := fs.Sub(migrationsFS, "migrations") // a constant directory of the embedded tree
	return schema.Source{Name: "placeorder_shop", FS: sub}
}

// Config configures the Place Order application. Pool and AMQPURL are
// required; everything else has a default.
type Config struct {
	// Pool is the database of the sagas, the runtime tables and the
	// services. Size it for 4 × Relays (each holds a LISTEN connection,
	// claims while it settles, and prunes) + 5 consumers × (Concurrency + 1
	// while it prunes its inbox claims) + 2.
	Pool *pgxpool.Pool
	// AMQPURL is the broker (amqp:// or amqps://).
	AMQPURL string
	// QueueType is the type of every work queue; default broker.QueueQuorum.
	QueueType broker.QueueType
	// Relays is how many outbox relays to run; default 1.
	Relays int
	// Concurrency, Prefetch and BatchSize tune every consumer (see
	// consumer.Config); zero takes the consumer's defaults. The inventory
	// consumer always runs one worker: every reservation updates a few hot
	// stock rows, and two workers applying batches in their own transactions
	// lock those rows in opposite orders (a deadlock, retried, costing a
	// second each). One worker applying whole batches in one transaction
	// shares the commit and never waits. Across processes, inventory
	// batches serialize on an advisory lock (see lockStock) for the same
	// reason.
	Concurrency, Prefetch, BatchSize int
	// Retry is the consumers' retry policy; default retry.Default(). The
	// work queues' tier queues are declared for it.
	Retry retry.Policy
	// TimeoutScanInterval is how often the saga's timeout scanner looks for
	// due instances; default 1s.
	TimeoutScanInterval time.Duration
	// DrainTimeout bounds the consumers' graceful shutdown; default 30s.
	DrainTimeout time.Duration
	// Now is the saga engine's clock (step timeouts and deadlines); default
	// time.Now. Tests and the demo move it forward to fire step timeouts
	// without waiting for them.
	Now func() time.Time
	// Script injects faults into the participants; nil injects none.
	Script *Script
	// Faults injects random participant faults (chaos runs); nil injects
	// none.
	Faults *Faults
	// Roles are the parts of the application this process runs; default
	// AllRoles. Migrations and topology are applied whatever the roles.
	Roles []Role
	// StepTimeouts overrides the contract's step timeouts by step name
	// (saga.Config.StepTimeouts), e.g. seconds instead of a minute for a
	// soak run that must see real timeouts fire. Nil keeps the contract's.
	StepTimeouts map[string]time.Duration
	// RelayLease is the relays' lease on claimed outbox rows
	// (outbox.RelayConfig.LeaseDuration); zero takes the relay's default.
	// Rows of a relay that crashed are published again by another relay
	// once its database session is gone, or at the latest when it runs out.
	RelayLease time.Duration
	// KeepPublished and KeepClaims are how long published outbox rows and
	// the consumers' inbox claims are kept (outbox.RelayConfig.KeepPublished,
	// consumer.Config.KeepClaims); zero takes the runtime's defaults (7 and
	// 30 days), negative keeps them.
	KeepPublished, KeepClaims time.Duration
	// Crashes arms crash points (chaos runs); nil arms none. Install
	// Crashes.Tracer on Pool's connections for the runtime's points.
	Crashes *Crashes
	// Logger receives the runtime's logs; default slog.Default().
	Logger *slog.Logger
	// Telemetry receives the runtime's spans and metrics (saga engine,
	// relays, consumers); the zero value turns them off.
	Telemetry telemetry.Providers
}

func (c *Config) setDefaults() {
	if c.QueueType == "" {
		c.QueueType = broker.QueueQuorum
	}
	if c.Relays == 0 {
		c.Relays = 1
	}
	if c.Retry.IsZero() {
		c.Retry = retry.Default()
	}
	if c.TimeoutScanInterval == 0 {
		c.TimeoutScanInterval = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if len(c.Roles) == 0 {
		c.Roles = AllRoles()
	}
}

// Validate reports every problem with c (after defaults).
func (c *Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("pool is required"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("AMQP URL is required"))
	}
	if c.Relays < 1 {
		errs = append(errs, fmt.Errorf("relays %d: want at least 1", c.Relays))
	}
	if c.TimeoutScanInterval < 0 {
		errs = append(errs, fmt.Errorf("timeout scan interval %s is negative", c.TimeoutScanInterval))
	}
	if c.RelayLease < 0 {
		errs = append(errs, fmt.Errorf("relay lease %s is negative", c.RelayLease))
	}
	for _, r := range c.Roles {
		if !slices.Contains(AllRoles(), r) {
			errs = append(errs, fmt.Errorf("unknown role %q", r))
		}
	}
	if f := c.Faults; f != nil {
		for name, p := range map[string]float64{"transient": f.Transient, "slow": f.Slow, "duplicate": f.Duplicate} {
			if p < 0 || p > 1 {
				errs = append(errs, fmt.Errorf("fault probability %s = %v: want [0, 1]", name, p))
			}
		}
		if f.Slow > 0 && f.SlowDelay <= 0 {
			errs = append(errs, errors.New("slow replies need a positive SlowDelay"))
		}
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("retry policy: %w", err))
	}
	return errors.Join(errs...)
}

// App is the Place Order application: the saga, its four participants, the
// outbox relays, the consumers and the timeout scanner, in one process. In
// production each service runs its own process with the same wiring; any
// number of copies may run side by side.
type App struct {
	cfg Config

	// PlaceOrder starts and inspects Place Order sagas.
	PlaceOrder *orderv1.PlaceOrder

	reg       *message.Registry
	inventory *Inventory
	payment   *Payment
	shipping  *Shipping
	approval  *Approval

	consumers map[string]*consumer.Consumer // by queue
	relays    []*outbox.Relay
	pub, sub  *broker.Conn
	slow      *slowReplies
}

// New prepares the application: it applies the migrations (runtime,
// participant, saga and services), connects to the broker (one connection for
// publishing, one for consuming), declares the topology and builds the
// relays and consumers. Nothing is consumed or relayed until Run. Sagas may be
// started as soon as New returns: their first commands wait in the outbox.
func New(ctx context.Context, cfg Config) (*App, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("place order app: %w", err)
	}
	a := &App{cfg: cfg, slow: newSlowReplies()}
	if err := schema.Migrate(ctx, cfg.Pool, participant.Migrations, orderv1.PlaceOrderMigrations(), Migrations()); err != nil {
		return nil, fmt.Errorf("place order app: migrate: %w", err)
	}
	reg, err := message.NewRegistry(
		inventoryv1.ReserveInventoryInfo, inventoryv1.InventoryReservedInfo, inventoryv1.InventoryReservationFailedInfo,
		inventoryv1.ReleaseInventoryInfo, inventoryv1.InventoryReleasedInfo,
		paymentv1.AuthorizePaymentInfo, paymentv1.PaymentAuthorizedInfo, paymentv1.PaymentAuthorizationFailedInfo,
		shippingv1.ScheduleShippingInfo, shippingv1.ShippingScheduledInfo,
		orderv1.PlaceOrderRequestInfo, orderv1.ApproveOrderInfo, orderv1.OrderApprovedInfo,
	)
	if err != nil {
		return nil, fmt.Errorf("place order app: registry: %w", err)
	}
	a.reg = reg
	a.inventory, a.payment, a.shipping, a.approval = &Inventory{reg: reg, crashes: cfg.Crashes}, &Payment{reg}, &Shipping{reg}, &Approval{reg}

	a.PlaceOrder, err = orderv1.NewPlaceOrder(saga.Config{
		Pool: cfg.Pool, Now: cfg.Now, Logger: cfg.Logger, StepTimeouts: cfg.StepTimeouts, Telemetry: cfg.Telemetry,
	}, Decider{})
	if err != nil {
		return nil, fmt.Errorf("place order app: %w", err)
	}
	if err := a.PlaceOrder.Engine().CheckStates(ctx); err != nil {
		return nil, fmt.Errorf("place order app: %w", err)
	}

	if err := a.connect(ctx); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.build(); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// queues lists every work queue the configured roles consume with its
// handler: one per participant service (the generated Register functions
// name the queue) and the saga's own.
func (a *App) queues() map[string]consumer.HandlerFunc {
	out := map[string]consumer.HandlerFunc{}
	for _, p := range []struct {
		role Role
		reg  func() (string, consumer.HandlerFunc)
	}{
		{RoleInventory, func() (string, consumer.HandlerFunc) { return inventoryv1.RegisterInventoryParticipant(a.inventory) }},
		{RolePayment, func() (string, consumer.HandlerFunc) { return paymentv1.RegisterPaymentParticipant(a.payment) }},
		{RoleShipping, func() (string, consumer.HandlerFunc) { return shippingv1.RegisterShippingParticipant(a.shipping) }},
		{RoleOrder, func() (string, consumer.HandlerFunc) { return orderv1.RegisterOrderParticipant(a.approval) }},
	} {
		if !a.cfg.has(p.role) {
			continue
		}
		q, h := p.reg()
		out[q] = a.scripted(a.faulty(h))
	}
	if a.cfg.has(RoleOrchestrator) {
		out[a.PlaceOrder.Queue()] = a.PlaceOrder.Handler()
	}
	return out
}

// Topology is the merged topology of the example's packages, with work queues
// of the configured type and retry tiers for the configured policy (the one the
// consumers use).
func (a *App) Topology() broker.Topology { return Topology(a.cfg.QueueType, a.cfg.Retry) }

// Topology is the merged topology of the example's packages with work queues
// of type qt and retry tiers for policy p.
func Topology(qt broker.QueueType, p retry.Policy) broker.Topology {
	return inventoryv1.TopologyWith(qt, p).
		Merge(paymentv1.TopologyWith(qt, p)).
		Merge(shippingv1.TopologyWith(qt, p)).
		Merge(orderv1.TopologyWith(qt, p))
}

func (a *App) connect(ctx context.Context) error {
	var err error
	a.pub, err = broker.Dial(ctx, a.cfg.AMQPURL, broker.ConnConfig{Name: "placeorder-publish", Logger: a.cfg.Logger, Meter: a.cfg.Telemetry.Meter})
	if err != nil {
		return fmt.Errorf("place order app: dial broker for publishing: %w", err)
	}
	a.sub, err = broker.Dial(ctx, a.cfg.AMQPURL, broker.ConnConfig{Name: "placeorder-consume", Logger: a.cfg.Logger, Meter: a.cfg.Telemetry.Meter})
	if err != nil {
		return fmt.Errorf("place order app: dial broker for consuming: %w", err)
	}
	ch, err := a.pub.Channel(ctx)
	if err != nil {
		return fmt.Errorf("place order app: channel for topology: %w", err)
	}
	defer ch.Close()
	topo := a.Topology()
	if err := topo.Validate(); err != nil {
		return fmt.Errorf("place order app: topology: %w", err)
	}
	if err := broker.Declare(ctx, ch, topo); err != nil {
		return fmt.Errorf("place order app: declare topology: %w", err)
	}
	return nil
}

func (a *App) build() error {
	for i := range a.cfg.Relays {
		if !a.cfg.has(RoleRelay) {
			break
		}
		r, err := outbox.NewRelay(outbox.RelayConfig{
			Pool: a.cfg.Pool, Conn: a.pub, Logger: a.cfg.Logger, LeaseDuration: a.cfg.RelayLease, Telemetry: a.cfg.Telemetry,
			KeepPublished: a.cfg.KeepPublished,
		})
		if err != nil {
			return fmt.Errorf("place order app: relay %d: %w", i, err)
		}
		a.relays = append(a.relays, r)
	}
	a.consumers = map[string]*consumer.Consumer{}
	inventoryQueue, _ := inventoryv1.RegisterInventoryParticipant(a.inventory)
	for queue, h := range a.queues() {
		concurrency := a.cfg.Concurrency
		if queue == inventoryQueue {
			concurrency = 1
		}
		c, err := consumer.New(consumer.Config{
			Name:         queue,
			Queue:        queue,
			Pool:         a.cfg.Pool,
			Conn:         a.sub,
			PublishConn:  a.pub,
			Registry:     a.reg,
			Handler:      h,
			Prefetch:     a.cfg.Prefetch,
			Concurrency:  concurrency,
			BatchSize:    a.cfg.BatchSize,
			Retry:        a.cfg.Retry,
			DrainTimeout: a.cfg.DrainTimeout,
			KeepClaims:   a.cfg.KeepClaims,
			Logger:       a.cfg.Logger.With("queue", queue),
			Telemetry:    a.cfg.Telemetry,
		})
		if err != nil {
			return fmt.Errorf("place order app: consumer of %s: %w", queue, err)
		}
		a.consumers[queue] = c
	}
	return nil
}

// Run runs the configured roles — relays the outbox, consumes the queues and
// fires due timeouts — until ctx is cancelled, then drains in-flight work and
// returns nil. If one part stops with an error, Run stops the others and
// returns it.
func (a *App) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel()
			}
		})
	}
	// Relays stop after the consumers have drained, so that they publish
	// what the consumers' last batches hand them rather than release it.
	relayCtx, stopRelays := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelays()
	var consumers sync.WaitGroup
	consumers.Add(len(a.consumers))
	context.AfterFunc(ctx, func() {
		consumers.Wait()
		stopRelays()
	})
	for i, r := range a.relays {
		run(fmt.Sprintf("relay %d", i), func(context.Context) error { return r.Run(withPart(relayCtx, partRelay)) })
	}
	n := 0
	for queue, c := range a.consumers {
		cctx := withPart(ctx, partConsumer)
		if len(a.relays) > 0 {
			// The outbox rows this consumer's handlers commit go straight
			// to a relay of this process, without a claim.
			cctx = outbox.WithRelay(cctx, a.relays[n%len(a.relays)])
			n++
		}
		run("consumer of "+queue, func(context.Context) error {
			defer consumers.Done()
			return c.Run(cctx)
		})
	}
	if a.cfg.has(RoleOrchestrator) {
		run("timeout scanner", func(ctx context.Context) error {
			return a.PlaceOrder.Engine().RunTimeouts(withPart(ctx, partScanner), a.cfg.TimeoutScanInterval)
		})
	}
	if a.cfg.Faults != nil && a.cfg.Faults.Slow > 0 {
		run("held-back replies", a.runSlowReplies)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WithRelay returns ctx carrying one of the application's relays
// (outbox.WithRelay), for starting sagas in this process: PlaceOrder.Start
// under it hands the first commands to that relay after its commit, without
// a claim. Without relays (a process that does not run RoleRelay) it
// returns ctx as it is.
func (a *App) WithRelay(ctx context.Context) context.Context {
	if len(a.relays) == 0 {
		return ctx
	}
	return outbox.WithRelay(ctx, a.relays[0])
}

// RelayStats sums the counters of the application's relays.
func (a *App) RelayStats() outbox.RelayStats {
	var s outbox.RelayStats
	for _, r := range a.relays {
		rs := r.Stats()
		s.Published += rs.Published
		s.Failed += rs.Failed
		s.HandedOff += rs.HandedOff
	}
	return s
}

// Close closes the broker connections. Call it after Run has returned.
func (a *App) Close() {
	for _, c := range []*broker.Conn{a.sub, a.pub} {
		if c != nil {
			_ = c.Close()
		}
	}
}

// Restock sets the available stock of a product.
func (a *App) Restock(ctx context.Context, productID string, available int32) error {
	if _, err := a.cfg.Pool.Exec(ctx, `INSERT INTO inventory_stock (product_id, available) VALUES ($1, $2)
ON CONFLICT (product_id) DO UPDATE SET available = EXCLUDED.available`, productID, available); err != nil {
		return fmt.Errorf("restock %s: %w", productID, err)
	}
	return nil
}
