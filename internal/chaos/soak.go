package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/examples/placeorder/app"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	travelapp "github.com/protosaga/saga/examples/travel/app"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

// Config configures one soak run.
type Config struct {
	// Bin is the soak binary (examples/placeorder/cmd/soak), run as nodes.
	Bin string
	// Services are the servers to run against. The run restarts them when
	// BrokerRestarts or PostgresRestarts ask for it: they must not be shared
	// with anything running at the same time.
	Services *testenv.Services
	// LogDir receives one log file per node; default a temporary directory.
	LogDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// Seed drives every random choice of the run (orders, faults, kills).
	Seed uint64
	// Sagas is how many Place Order sagas to start, and Trips how many
	// Book Trip sagas (the travel example) alongside them; Rate is how many
	// of both are started per second, each kind spread evenly over the
	// load phase.
	Sagas, Trips int
	Rate         float64

	// Relays, Orchestrators and Participants are how many node processes
	// run each kind of role (participants run all four services).
	Relays, Orchestrators, Participants int

	// CrashPoints arms the named crash points: every point is armed in
	// some node until it has fired once; after that, a restarted node is
	// armed again with probability Rearm.
	CrashPoints bool
	Rearm       float64
	// KillEvery is the mean interval between SIGKILLs of a random node at
	// an arbitrary moment while sagas are being started; zero kills none.
	KillEvery time.Duration
	// BrokerRestarts and PostgresRestarts are how many times each server is
	// restarted, evenly spread over the load phase.
	BrokerRestarts, PostgresRestarts int
	// NodeKills, on a RabbitMQ cluster (Services.Nodes > 0), is how many
	// times the node that leads most of the run's quorum queues is
	// SIGKILLed, evenly spread over the load phase; it is started again
	// NodeDown later (default 10 s) and rejoins the cluster.
	NodeKills int
	NodeDown  time.Duration
	// Failover, on a PostgreSQL with a replica (Services.Replica), crashes
	// the primary and promotes the replica once, in the middle of the load
	// phase; the fleet follows through the multi-host URL.
	Failover bool

	// Participant faults (see Faults) and the step timeout they race.
	Transient, Slow, Duplicate float64
	SlowDelay                  time.Duration
	StepTimeout                time.Duration
	// DeclinedShare and SoldOutShare are the shares of orders and of trips
	// that fail for business reasons (a declined card; a product without
	// stock, a flight without a seat); RejectedShare the share of trips
	// whose traveller's passport is expired (the check step fails),
	// NoPermitShare of those whose traveller is refused an entry permit
	// (the external check step fails).
	DeclinedShare, SoldOutShare, RejectedShare, NoPermitShare float64

	// SettleTimeout bounds the wait, after the load phase, for every saga to
	// end (terminal or manual review) and every queue to drain.
	SettleTimeout time.Duration
	// SampleRSS samples every node's resident set size each interval
	// (zero: never); MaxRSSGrowth, when positive, makes a node whose RSS
	// grew more than that factor between the second quarter and the last
	// quarter of a long life a violation.
	SampleRSS    time.Duration
	MaxRSSGrowth float64
}

func (c *Config) setDefaults() {
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Rate <= 0 {
		c.Rate = 20
	}
	if c.Relays <= 0 {
		c.Relays = 2
	}
	if c.Orchestrators <= 0 {
		c.Orchestrators = 2
	}
	if c.Participants <= 0 {
		c.Participants = 2
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = 6 * time.Second
	}
	if c.SlowDelay <= 0 {
		c.SlowDelay = c.StepTimeout + 2*time.Second
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 3 * time.Minute
	}
	if c.NodeDown <= 0 {
		c.NodeDown = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// retryPolicy is the nodes' consumer retry policy: short tiers, and a budget
// small enough that injected transient failures sometimes exhaust it (and
// park a message that belongs to a saga).
var retryPolicy = retry.Policy{Tiers: []time.Duration{200 * time.Millisecond, time.Second}, MaxAttempts: 3}

// relayLease bounds how long a killed relay's claimed rows wait.
const relayLease = 3 * time.Second

// order is one saga the driver started: a Place Order or a Book Trip.
type order struct {
	saga    string // sagaPlaceOrder or sagaBookTrip
	id      string // the business key
	kind    string // "ok", "declined", "sold-out" or "rejected"
	sagaID  string
	started time.Time
	// insured and remind, for a trip: it asked for insurance; it departs
	// within a day, so its check-in reminder is due at once.
	insured, remind bool
}

// The soak's saga types, as reported.
const (
	sagaPlaceOrder = "PlaceOrder"
	sagaBookTrip   = "BookTrip"
	sagaPayment    = "Payment" // Book Trip's child, started by its ChargeTrip step
)

// Order kinds.
const (
	kindOK       = "ok"
	kindDeclined = "declined"
	kindSoldOut  = "sold-out"
	kindRejected = "rejected"  // trips only
	kindNoPermit = "no-permit" // trips only
)

// products hold plenty of stock; soldOut holds none.
var products = []string{"p-anvil", "p-bolt", "p-cog", "p-drill", "p-epoxy", "p-file"}

const (
	soldOut      = "p-sold-out"
	initialStock = 1_000_000
)

// run is one soak run in progress.
type run struct {
	cfg   Config
	id    string
	pgURL string
	amqp  string
	vhost string
	pool  *pgxpool.Pool
	po    *orderv1.PlaceOrder
	bt    *tripv1.BookTrip
	fleet *Fleet
	rng   *mrand.Rand
	// receiver is the client the orders' outcomes are called back to;
	// callbackKeys the dispatchers' signing key, in callback.EnvKeys form.
	receiver     *receiver
	callbackKeys string

	mu       sync.Mutex
	orders   []*order
	restarts map[string]int
	fired    map[CrashPoint]bool
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "%s soak %s: %s\n", time.Now().Format("15:04:05.000"), r.id, fmt.Sprintf(format, args...))
}

// Run runs one soak: it starts the node fleet, starts cfg.Sagas Place Order
// and cfg.Trips Book Trip sagas while faults, kills and restarts happen,
// waits for everything to settle, stops the fleet and checks the
// invariants. A returned error means the run could
// not be carried out; broken invariants are Report.Violations.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.setDefaults()
	if cfg.Bin == "" || cfg.Services == nil || cfg.Sagas <= 0 {
		return nil, errors.New("soak: Bin, Services and Sagas are required")
	}
	if cfg.Services.Nodes > 0 && cfg.BrokerRestarts > 0 {
		return nil, errors.New("soak: a RabbitMQ cluster loses nodes (NodeKills), it is not restarted whole (BrokerRestarts)")
	}
	if cfg.NodeKills > 0 && cfg.Services.Nodes < 2 {
		return nil, errors.New("soak: NodeKills needs a RabbitMQ cluster of two nodes or more")
	}
	if cfg.Failover && (!cfg.Services.Replica || cfg.PostgresRestarts > 0) {
		return nil, errors.New("soak: Failover needs a PostgreSQL with a replica, and no PostgresRestarts")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	r := &run{
		cfg:      cfg,
		id:       "soak_" + hex.EncodeToString(b[:]),
		rng:      mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		restarts: map[string]int{},
		fired:    map[CrashPoint]bool{},
	}
	if r.cfg.LogDir == "" {
		dir, err := os.MkdirTemp("", r.id+"-")
		if err != nil {
			return nil, err
		}
		r.cfg.LogDir = dir
	} else if err := os.MkdirAll(r.cfg.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("soak: node log directory: %w", err)
	}
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	defer r.pool.Close()
	keys, key := newCallbackKey()
	rcv, err := startReceiver(key)
	if err != nil {
		return nil, err
	}
	defer rcv.server.Close()
	r.receiver, r.callbackKeys = rcv, keys
	r.logf("schema and vhost %s, seed %d, node logs in %s", r.id, cfg.Seed, r.cfg.LogDir)

	began := time.Now()
	r.fleet = NewFleet(cfg.Bin, r.cfg.LogDir, r.logf)
	fleetCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	r.startFleet(fleetCtx)
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	for _, p := range r.fleet.Procs() {
		if err := p.WaitReady(readyCtx); err != nil {
			cancel()
			r.fleet.Stop(10 * time.Second)
			return nil, fmt.Errorf("soak: %w (logs in %s)", err, r.cfg.LogDir)
		}
	}
	cancel()
	if cfg.SampleRSS > 0 {
		go r.fleet.SampleRSS(fleetCtx, cfg.SampleRSS)
	}
	r.logf("fleet ready: %d nodes", len(r.fleet.Procs()))

	loadDone := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() { defer close(loadDone); r.load(ctx) }()
	go func() { defer close(chaosDone); r.chaos(ctx, loadDone) }()
	<-loadDone
	<-chaosDone
	if ctx.Err() != nil {
		r.fleet.Stop(10 * time.Second)
		return nil, ctx.Err()
	}
	r.logf("load phase over: %d sagas started in %s", len(r.orders), time.Since(began).Round(time.Millisecond))

	settleErr := r.settle(ctx)
	settled := time.Now()
	r.fleet.Stop(30 * time.Second)
	r.logf("fleet stopped")

	rep, err := r.check(ctx)
	if err != nil {
		return nil, err
	}
	rep.Duration = settled.Sub(began)
	if settleErr != nil {
		rep.Violations = append([]string{settleErr.Error()}, rep.Violations...)
	}
	r.figures(rep)
	if len(rep.Violations) > 0 {
		rep.Violations = append(rep.Violations, "node logs: "+r.cfg.LogDir)
	} else {
		_ = os.RemoveAll(r.cfg.LogDir)
	}
	return rep, nil
}

// setup creates the run's schema and vhost, migrates, stocks the products
// and builds the engine the driver starts sagas with.
func (r *run) setup(ctx context.Context) error {
	s := r.cfg.Services
	admin, err := pgx.Connect(ctx, s.PostgresURL)
	if err != nil {
		return fmt.Errorf("soak: connect: %w", err)
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+r.id)
	admin.Close(ctx)
	if err != nil {
		return fmt.Errorf("soak: create schema: %w", err)
	}
	u, err := url.Parse(s.PostgresURL)
	if err != nil {
		return fmt.Errorf("soak: parse PostgreSQL URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", r.id)
	q.Set("application_name", r.id)
	u.RawQuery = q.Encode()
	r.pgURL = u.String()
	r.vhost = r.id
	if r.amqp, err = s.CreateVHost(ctx, r.vhost); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(r.pgURL)
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	pcfg.MaxConns = 8
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("soak: open pool: %w", err)
	}
	if err := schema.Migrate(ctx, r.pool, participant.Migrations, orderv1.PlaceOrderMigrations(), app.Migrations(),
		tripv1.BookTripMigrations(), paymentv1.PaymentMigrations(), travelapp.Migrations()); err != nil {
		return fmt.Errorf("soak: migrate: %w", err)
	}
	for _, p := range append(slices.Clone(products), soldOut) {
		stock := initialStock
		if p == soldOut {
			stock = 0
		}
		if _, err := r.pool.Exec(ctx, `INSERT INTO inventory_stock (product_id, available) VALUES ($1, $2)`, p, stock); err != nil {
			return fmt.Errorf("soak: stock %s: %w", p, err)
		}
	}
	if err := r.stockTravel(ctx); err != nil {
		return err
	}
	timeouts := stepTimeouts(r.cfg.StepTimeout)
	r.po, err = orderv1.NewPlaceOrder(saga.Config{
		Pool: r.pool, StepTimeouts: timeouts[orderv1.PlaceOrderDefinition().Name], Logger: slog.New(slog.DiscardHandler),
	}, app.Decider{})
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	r.bt, err = tripv1.NewBookTrip(saga.Config{
		Pool: r.pool, StepTimeouts: timeouts[tripv1.BookTripDefinition().Name], Logger: slog.New(slog.DiscardHandler),
	}, travelapp.Decider{})
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	return nil
}

// pointsFor says which crash points a node's roles can reach.
func pointsFor(roles []Role) []CrashPoint {
	var points []CrashPoint
	if slices.Contains(roles, RoleRelay) {
		points = append(points, CrashAfterPublish)
	}
	switch {
	case slices.Contains(roles, RoleOrchestrator):
		points = append(points, CrashAfterCommit)
	case slices.ContainsFunc(roles, func(r Role) bool { return slices.Contains(ParticipantRoles(), r) }):
		points = append(points, CrashMidCompensation, CrashCompensationCommitted, CrashAfterCommit)
	}
	return points
}

func (r *run) startFleet(ctx context.Context) {
	base := NodeConfig{
		PostgresURL: r.pgURL,
		AMQPURL:     r.amqp,
		Faults: Faults{
			Seed: r.cfg.Seed, Transient: r.cfg.Transient, Slow: r.cfg.Slow, SlowDelay: r.cfg.SlowDelay, Duplicate: r.cfg.Duplicate,
		},
		StepTimeout:  r.cfg.StepTimeout,
		RelayLease:   relayLease,
		Retry:        retryPolicy,
		Concurrency:  2,
		BatchSize:    8,
		CallbackKeys: r.callbackKeys,
	}
	add := func(name string, roles []Role) {
		cfg := base
		cfg.Name, cfg.Roles = name, roles
		var arm func(int) map[CrashPoint]int
		if r.cfg.CrashPoints {
			points := pointsFor(roles)
			arm = func(int) map[CrashPoint]int { return r.arm(points) }
		}
		r.fleet.Add(ctx, cfg, arm)
	}
	for i := range r.cfg.Relays {
		add(fmt.Sprintf("relay-%d", i+1), []Role{RoleRelay})
	}
	// Orchestrator and participant nodes run a relay too, so their
	// consumers hand committed rows to it (consumer.Config.Relay) and a kill
	// between a commit and its publish leaves rows leased to a dead node;
	// the relay nodes claim what is written outside consumers (the
	// driver's starts) and what dead nodes left behind.
	for i := range r.cfg.Orchestrators {
		add(fmt.Sprintf("orchestrator-%d", i+1), []Role{RoleOrchestrator, RoleRelay})
	}
	for i := range r.cfg.Participants {
		add(fmt.Sprintf("participants-%d", i+1), append(ParticipantRoles(), RoleRelay))
	}
}

// arm chooses the crash points of one node incarnation: every point of its
// roles that has not fired yet, so that a point fires wherever its passage
// comes first, or, once they all fired, one at random with probability
// Rearm. The passage that fires each is random. (Arming one open point per
// incarnation, picked by the node's index, left a point unarmed on every
// node for a whole run when the nodes that would have rotated to it were
// not killed again: a short soak of 200 sagas ended with no kill at
// compensation-after-commit.)
func (r *run) arm(points []CrashPoint) map[CrashPoint]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.markFired()
	armed := map[CrashPoint]int{}
	for _, p := range points {
		if !r.fired[p] {
			armed[p] = r.passage(p)
		}
	}
	if len(armed) > 0 {
		return armed
	}
	if r.rng.Float64() < r.cfg.Rearm {
		p := points[r.rng.IntN(len(points))]
		return map[CrashPoint]int{p: r.passage(p)}
	}
	return nil
}

// passage picks which passage of p fires it (r.mu held).
func (r *run) passage(p CrashPoint) int {
	if p == CrashAfterCommit || p == CrashAfterPublish {
		// Somewhere in the node's next few hundred batches.
		return 1 + r.rng.IntN(150)
	}
	return 1
}

// markFired records the crash points that killed a node so far (r.mu held).
func (r *run) markFired() {
	_, kills, _ := r.fleet.Counts()
	for _, p := range CrashPoints() {
		if kills["crash:"+string(p)] > 0 {
			r.fired[p] = true
		}
	}
}

// request builds order i of the run.
func (r *run) request(i int) (*orderv1.PlaceOrderRequest, string) {
	r.mu.Lock()
	roll := r.rng.Float64()
	n := 1 + r.rng.IntN(3)
	lines := make([]*commonv1.OrderLine, 0, n+1)
	for _, j := range r.rng.Perm(len(products))[:n] {
		lines = append(lines, &commonv1.OrderLine{ProductId: products[j], Quantity: int32(1 + r.rng.IntN(3))})
	}
	r.mu.Unlock()
	kind, card := kindOK, "tok_visa"
	switch {
	case roll < r.cfg.DeclinedShare:
		kind, card = kindDeclined, app.DeclinedCard
	case roll < r.cfg.DeclinedShare+r.cfg.SoldOutShare:
		kind = kindSoldOut
		lines = append(lines, &commonv1.OrderLine{ProductId: soldOut, Quantity: 1})
	}
	return &orderv1.PlaceOrderRequest{
		OrderId:         fmt.Sprintf("%s-o%05d", r.id, i),
		CustomerId:      fmt.Sprintf("c-%d", i%97),
		Lines:           lines,
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: int64(1000 + i)},
		ShippingAddress: &commonv1.Address{Name: "A. Customer", Street: "1 Main St", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       card,
		CallbackUrl:     r.receiver.url + fmt.Sprintf("%s-o%05d", r.id, i),
	}, kind
}

// load starts the Place Order sagas and the Book Trip sagas alongside, at
// the configured rate of both together, each kind over the same time.
func (r *run) load(ctx context.Context) {
	total := float64(r.cfg.Sagas + r.cfg.Trips)
	var wg sync.WaitGroup
	wg.Go(func() {
		r.startAt(ctx, r.cfg.Sagas, r.cfg.Rate*float64(r.cfg.Sagas)/total, func(i int) (*order, startFunc) {
			req, kind := r.request(i)
			return &order{saga: sagaPlaceOrder, id: req.GetOrderId(), kind: kind}, func(ctx context.Context) (string, error) {
				id, _, err := r.po.Start(ctx, req, message.Meta{})
				return id, err
			}
		})
	})
	if r.cfg.Trips > 0 {
		wg.Go(func() {
			r.startAt(ctx, r.cfg.Trips, r.cfg.Rate*float64(r.cfg.Trips)/total, func(i int) (*order, startFunc) {
				req, o := r.tripRequest(i)
				return o, func(ctx context.Context) (string, error) {
					id, _, err := r.bt.Start(ctx, req, message.Meta{})
					return id, err
				}
			})
		})
	}
	wg.Wait()
}

// startFunc starts one saga and returns its id.
type startFunc func(context.Context) (string, error)

// startAt starts n sagas at rate per second, saga i built by next. A start
// that fails (the database restarting) is retried: starting is idempotent
// on the business key.
func (r *run) startAt(ctx context.Context, n int, rate float64, next func(i int) (*order, startFunc)) {
	t0 := time.Now()
	every := time.Duration(float64(time.Second) / rate)
	for i := range n {
		if !sleep(ctx, time.Until(t0.Add(time.Duration(i)*every))) && ctx.Err() != nil {
			return
		}
		o, start := next(i)
		o.started = time.Now()
		for attempt := 0; ; attempt++ {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			id, err := start(sctx)
			cancel()
			if err == nil {
				o.sagaID = id
				break
			}
			if ctx.Err() != nil {
				return
			}
			if attempt%20 == 0 {
				r.logf("start %s failed (retrying): %v", o.id, err)
			}
			sleep(ctx, 250*time.Millisecond)
		}
		r.mu.Lock()
		r.orders = append(r.orders, o)
		r.mu.Unlock()
	}
}

// chaos kills nodes at random and restarts the servers until the load is
// done (and the restarts it scheduled are done).
func (r *run) chaos(ctx context.Context, loadDone <-chan struct{}) {
	loadTime := time.Duration(float64(r.cfg.Sagas+r.cfg.Trips) / r.cfg.Rate * float64(time.Second))
	t0 := time.Now()
	var wg sync.WaitGroup
	type restart struct {
		at   time.Duration
		name string
		do   func(context.Context) error
	}
	var plan []restart
	for i := range r.cfg.BrokerRestarts {
		plan = append(plan, restart{loadTime * time.Duration(2*i+1) / time.Duration(2*r.cfg.BrokerRestarts+1), "broker",
			r.cfg.Services.RestartRabbitMQ})
	}
	for i := range r.cfg.NodeKills {
		plan = append(plan, restart{loadTime * time.Duration(2*i+1) / time.Duration(2*r.cfg.NodeKills+1), "rabbitmq-leader-node",
			r.killLeader})
	}
	if r.cfg.Failover {
		plan = append(plan, restart{loadTime / 2, "postgres-failover", r.cfg.Services.Failover})
	}
	for i := range r.cfg.PostgresRestarts {
		plan = append(plan, restart{loadTime * time.Duration(2*i+2) / time.Duration(2*r.cfg.PostgresRestarts+2), "postgres",
			func(ctx context.Context) error { return r.cfg.Services.RestartPostgres(ctx, true) }})
	}
	slices.SortFunc(plan, func(a, b restart) int { return int(a.at - b.at) })
	wg.Go(func() {
		for _, p := range plan {
			if !sleep(ctx, time.Until(t0.Add(p.at))) {
				return
			}
			start := time.Now()
			r.logf("restarting %s", p.name)
			if err := p.do(ctx); err != nil {
				r.logf("restart %s failed: %v", p.name, err)
				continue
			}
			r.mu.Lock()
			r.restarts[p.name]++
			r.mu.Unlock()
			r.logf("%s restarted in %s", p.name, time.Since(start).Round(time.Millisecond))
		}
	})
	if r.cfg.KillEvery > 0 {
		wg.Go(func() {
			for {
				r.mu.Lock()
				wait := time.Duration(float64(r.cfg.KillEvery) * (0.5 + r.rng.Float64()))
				r.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-loadDone:
					return
				case <-time.After(wait):
				}
				procs := r.fleet.Procs()
				r.mu.Lock()
				p := procs[r.rng.IntN(len(procs))]
				r.mu.Unlock()
				p.Kill()
			}
		})
	}
	wg.Wait()
}

// killLeader SIGKILLs the cluster node that leads most of the run's quorum
// queues, waits NodeDown and starts it again. Every queue must have a
// member on every node: a queue that lives on fewer would lose its leader
// with no replica to elect.
func (r *run) killLeader(ctx context.Context) error {
	s := r.cfg.Services
	qs, err := s.Queues(ctx, r.vhost)
	if err != nil {
		return err
	}
	led := map[string]int{}
	for _, q := range qs {
		if q.Leader == "" {
			continue // a classic queue
		}
		if len(q.Members) != s.Nodes {
			return fmt.Errorf("queue %s has members %v, not one on each of the %d nodes", q.Name, q.Members, s.Nodes)
		}
		led[q.Leader]++
	}
	leader, most := "", 0
	for name, n := range led {
		if n > most || (n == most && name < leader) {
			leader, most = name, n
		}
	}
	node := s.NodeOf(leader)
	if node == 0 {
		return fmt.Errorf("no quorum queue leader among the cluster's nodes (leaders: %v)", led)
	}
	r.logf("killing RabbitMQ node %d (%s), leader of %d of %d queues", node, leader, most, len(qs))
	if err := s.KillNode(ctx, node); err != nil {
		return err
	}
	if !sleep(ctx, r.cfg.NodeDown) {
		return ctx.Err()
	}
	return s.StartNode(ctx, node)
}

// settle waits until every saga has ended (terminal or manual review), the
// outbox is empty and the work and retry queues are drained, and this held
// for longer than a held-back reply can wait.
func (r *run) settle(ctx context.Context) error {
	quiet := r.cfg.SlowDelay + 3*time.Second
	deadline := time.Now().Add(r.cfg.SettleTimeout)
	var since time.Time
	lastLog := time.Now()
	var why string
	for {
		ok, w, err := r.quiescent(ctx)
		if err != nil {
			w = err.Error()
		}
		why = w
		switch {
		case ok && since.IsZero():
			since = time.Now()
		case !ok:
			since = time.Time{}
		}
		if !since.IsZero() && time.Since(since) >= quiet {
			r.logf("settled")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled %s after the load phase: %s", r.cfg.SettleTimeout, why)
		}
		if time.Since(lastLog) > 10*time.Second {
			r.logf("settling: %s", why)
			lastLog = time.Now()
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func (r *run) quiescent(ctx context.Context) (bool, string, error) {
	var open, unpublished, callbacks int
	if err := r.pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM saga_place_order WHERE state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'MANUAL_REVIEW'))
  + (SELECT count(*) FROM saga_book_trip WHERE state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'MANUAL_REVIEW'))
  + (SELECT count(*) FROM saga_payment WHERE state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'MANUAL_REVIEW')),
  (SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL),
  (SELECT count(*) FROM saga_callback WHERE delivered_at IS NULL AND parked_at IS NULL)`).Scan(&open, &unpublished, &callbacks); err != nil {
		return false, "", err
	}
	qs, err := r.cfg.Services.Queues(ctx, r.vhost)
	if err != nil {
		return false, "", err
	}
	busy := 0
	var busyNames []string
	for _, q := range qs {
		if isParking(q.Name) {
			continue
		}
		if q.Messages > 0 {
			busy += q.Messages
			busyNames = append(busyNames, fmt.Sprintf("%s=%d", q.Name, q.Messages))
		}
	}
	why := fmt.Sprintf("%d sagas still running, %d outbox rows unpublished, %d callbacks undelivered, %d messages queued %v", open, unpublished, callbacks, busy, busyNames)
	return open == 0 && unpublished == 0 && callbacks == 0 && busy == 0, why, nil
}
