// Command demo runs a fleet of Place Order sagas and a fleet of Book Trip
// sagas (examples/travel) through the real runtime, on PostgreSQL and
// RabbitMQ, prints what happened, and serves the operator console with a
// repair to make.
//
//	go run ./examples/placeorder/cmd/demo [-n 200] [-wait 90s] [-v] [-serve=false]
//
// The database and broker URLs come from SAGA_PG_URL and SAGA_AMQP_URL
// (scripts/with-services.sh sets them; `make demo` runs this program under it).
//
// Most orders go straight through. Some fail on purpose — a product without
// stock (failed, nothing to compensate), a declined card (inventory released),
// a carrier that fails twice (retried through the retry tiers) — and a few
// exercise the step timeouts: a participant that never answers (the step times
// out and is compensated; its answer arrives late), one that answers late
// (applied while the saga still waits; the answer to the resend is a
// duplicate), and one that never answers at all (manual review after its
// attempts). One payment reply is sent twice, and a message nobody can decode
// is published to the inventory's queue (parked, while the fleet runs on).
// Shipping puts every booking on its carrier's pickup manifest under the
// carrier's fenced PostgreSQL lease (runtime/lock; docs/locks.md).
//
// The contract's step timeouts are 30 s and 1 min. Rather than wait, the demo
// makes the timeouts of those three orders due at once (their timeout_at is set
// to now; the timeout scanner does the rest); the summary says when it did.
// The saga clock is the real one throughout, so every timestamp is true and a
// saga started from outside times out when its contract says.
//
// After the orders, trips of the travel example run on the same host
// (-trips, default 28), each provoking one scenario in turn: booked with
// insurance; booked with insurance skipped by the decider; a sold-out flight
// (the hotel and car, held with it in a parallel group, are cancelled); a
// declined card (the child Payment saga fails, then the insurance, the car,
// hotel and flight are cancelled in reverse); a payment the fraud screening
// flags (the child voids the card authorization before it answers); an entry
// permit the destination denies (the external check step fails with nothing
// to undo; its event, published with the traveller's validation, may be
// recorded early); an expired passport (the check step fails with nothing to
// undo). The insurer fails each purchase twice before it answers: the
// insurance commands' own retry tiers (200ms, 1s) retry it within seconds.
// Each booked trip's itinerary is sent by the itinerary service's subscriber
// of TripBooked.
//
// Last, one order ships to a country no carrier serves: its shipping command
// is parked at once (retrying cannot help) and the saga waits for an operator.
// Its step resends the command when its timeout passes, and after its last
// attempt the saga goes to manual review; the printed repair walkthrough holds
// at every one of those moments.
//
// The demo serves the operator console and its API (package runtime/admin)
// and the runtime's Prometheus metrics on -addr (default 127.0.0.1:8090)
// through its host (runtime/host): the console at /admin/, the API at
// /admin/api/, metrics at /metrics, readiness at /readyz, and POST
// /sagas/place_order to start an order from outside. After the summary it
// keeps serving until interrupted (Ctrl-C, SIGTERM; -serve=false stops at
// once, -serve-for bounds it), so the parked order can be repaired: add the
// carrier, retry the step (console or sagactl), watch the saga complete, and
// dismiss the parked copies that no longer apply. Tokens come from
// SAGA_ADMIN_TOKENS ("name:role:token,..."), or are made up and printed.
// The runtime logs JSON (saga, message and trace ids on every line) at Info
// (-v: Debug) to -log (default: a file in the temporary directory, named in
// the output; "-": standard error).
//
// The demo exits non-zero when a saga is lost, stuck, or ends differently
// from what its order provoked.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/examples/placeorder/internal/script"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	travelapp "github.com/protosaga/saga/examples/travel/app"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/callback/signature"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// kind is what an order of the fleet provokes.
type kind string

const (
	happy       kind = "happy path"
	noStock     kind = "out of stock"
	declined    kind = "card declined"
	flakyShip   kind = "shipping fails twice"
	dupReply    kind = "payment reply sent twice"
	silentInv   kind = "inventory never answers"
	latePayment kind = "payment answers late"
	silentPay   kind = "payment never answers"
	unserved    kind = "ships where no carrier goes"
)

// unservedCountry is where no carrier of the example ships (see the app's
// shipping_carriers table) until an operator adds one.
const unservedCountry = "IS"

const (
	poisonMsgID    = "-poison"                  // suffix of the poison message's id
	placeOrderType = "shop.order.v1.PlaceOrder" // the saga's full name
)

// expected is the state each kind of order must end in.
var expected = map[kind]orderv1.PlaceOrderState{
	happy:       orderv1.PlaceOrderStateCompleted,
	noStock:     orderv1.PlaceOrderStateFailed,
	declined:    orderv1.PlaceOrderStateFailed,
	flakyShip:   orderv1.PlaceOrderStateCompleted,
	dupReply:    orderv1.PlaceOrderStateCompleted,
	silentInv:   orderv1.PlaceOrderStateFailed,
	latePayment: orderv1.PlaceOrderStateCompleted,
	silentPay:   orderv1.PlaceOrderStateManualReview,
	unserved:    orderv1.PlaceOrderStateScheduleShipping, // parked, waiting for an operator
}

// clockNeeded lists the kinds that settle only once a step's timeout fires.
var clockNeeded = map[kind]bool{silentInv: true, latePayment: true, silentPay: true}

type order struct {
	id     string
	kind   kind
	sagaID string
}

type demo struct {
	pgURL string // redacted, for the commands the demo prints
	// repairToken and readToken are the admin tokens the demo made up
	// (empty when they came from SAGA_ADMIN_TOKENS).
	repairToken, readToken string
	out                    io.Writer
	host                   *host.Host
	placeOrder             *orderv1.PlaceOrder
	pool                   *pgxpool.Pool
	amqp                   string
	script                 *script.Script
	manifests              *app.CarrierManifests
	runID                  string
	logPath                string // where the runtime's JSON logs go; "" for standard error
	stepTimeouts           map[string]time.Duration
	orders                 []*order
	wait                   time.Duration
	events                 []string  // what the demo did, in order
	receiver               *receiver // the client the orders' outcomes are called back to
	trips                  *tripv1.BookTrip
	tripList               []*trip
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 200, "number of sagas")
	nTrips := fs.Int("trips", 28, "number of Book Trip sagas (the travel example), after the orders")
	wait := fs.Duration("wait", 90*time.Second, "longest wait for the fleet to settle")
	verbose := fs.Bool("v", false, "log the runtime's info messages to stderr")
	addr := fs.String("addr", "127.0.0.1:8090", "where to serve the operator console, its API and /metrics (a free port if taken)")
	serve := fs.Bool("serve", true, "after the summary, keep serving the console until interrupted (Ctrl-C, SIGTERM)")
	serveFor := fs.Duration("serve-for", 0, "with -serve, stop serving after this long (0: until interrupted)")
	logFlag := fs.String("log", "", `write the runtime's JSON logs to this file ("-": standard error; default: a file in the temporary directory)`)
	stepTimeouts := stepTimeoutFlag{}
	fs.Var(stepTimeouts, "step-timeout", "STEP=DURATION: override a Place Order step's timeout from the contract (repeatable; for tests of the walkthrough)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 20 {
		return fmt.Errorf("-n %d: want at least 20 sagas (one of each scenario)", *n)
	}
	pgURL, amqpURL := getenv("SAGA_PG_URL"), getenv("SAGA_AMQP_URL")
	if pgURL == "" || amqpURL == "" {
		return errors.New("set SAGA_PG_URL and SAGA_AMQP_URL, " +
			"or run `make demo`, which starts PostgreSQL and RabbitMQ for you")
	}
	runID := "demo-" + time.Now().UTC().Format("20060102-150405")
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logOut, logPath := stderr, ""
	if *logFlag != "-" {
		logPath = *logFlag
		if logPath == "" {
			logPath = filepath.Join(os.TempDir(), "placeorder-"+runID+".log")
		}
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open the log file: %w", err)
		}
		defer f.Close()
		logOut = f
	}
	// The runtime's logs: JSON, with the saga, message and trace ids of
	// what each line is about (telemetry.NewLogHandler).
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level}), telemetry.LogOptions{}))

	poolCfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err) // pgx never puts the password in this error
	}
	poolCfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()

	d := &demo{
		out: stdout, pool: pool, amqp: amqpURL, script: script.New(), wait: *wait,
		runID: runID, pgURL: redactURL(pgURL), logPath: logPath, stepTimeouts: stepTimeouts,
	}
	began := time.Now()
	fmt.Fprintf(stdout, "Place Order demo %s: %d sagas on PostgreSQL and RabbitMQ (%s)\n", d.runID, *n, broker.Redact(amqpURL))
	tokens, err := d.adminTokens(getenv)
	if err != nil {
		return err
	}
	callbackKey := newCallbackKey()
	if d.receiver, err = startReceiver(callbackKey); err != nil {
		return err
	}
	defer d.receiver.server.Close()
	d.host, err = host.New(ctx, host.Config{
		Service:     "placeorder-demo",
		Pool:        pool,
		AMQPURL:     amqpURL,
		HTTPAddr:    freeAddr(*addr),
		AdminTokens: tokens,
		Relays:      2,
		Concurrency: 4,
		BatchSize:   16,
		// Short tiers, so the flaky carrier's retries show within seconds.
		Retry:                 retry.Policy{Tiers: []time.Duration{250 * time.Millisecond, time.Second, 2 * time.Second}, MaxAttempts: 5},
		TimeoutScanInterval:   200 * time.Millisecond,
		DrainTimeout:          10 * time.Second,
		StepTimeouts:          map[string]map[string]time.Duration{placeOrderType: stepTimeouts},
		StartEndpoints:        true, // POST /sagas/place_order: start an order from outside
		ParticipantMiddleware: d.script.Middleware,
		Logger:                logger,
		// Each order's outcome is called back to the demo's receiver, on
		// loopback, which the SSRF guard refuses unless allowed.
		Callbacks: &callback.Config{
			Keys:         []signature.Key{callbackKey},
			AllowPrivate: callback.AllowPrivate{Loopback: true},
			MinBackoff:   250 * time.Millisecond, MaxBackoff: 5 * time.Second,
		},
	})
	if err != nil {
		return err
	}
	d.manifests = app.NewCarrierManifests()
	if d.placeOrder, err = app.RegisterWithManifests(d.host, d.manifests); err != nil {
		d.host.Close()
		return err
	}
	if d.trips, err = travelapp.Register(d.host); err != nil {
		d.host.Close()
		return err
	}
	if err := d.host.Start(ctx); err != nil {
		return err
	}
	stopHost := func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return d.host.Stop(stopCtx)
	}
	for _, p := range []string{"widget", "gadget", "gizmo"} {
		if err := app.Restock(ctx, pool, p, 1_000_000); err != nil {
			_ = stopHost()
			return err
		}
	}
	if err := app.Restock(ctx, pool, "sold-out", 0); err != nil {
		_ = stopHost()
		return err
	}
	if err := d.stockTravel(ctx); err != nil {
		_ = stopHost()
		return err
	}
	// An earlier run's repair may have added a carrier for the unserved
	// country; take it out so this run's last order is parked again.
	if _, err := pool.Exec(ctx, `DELETE FROM shipping_carriers WHERE country = $1`, unservedCountry); err != nil {
		_ = stopHost()
		return fmt.Errorf("reset the carriers: %w", err)
	}
	c := d.console()
	d.event("migrated the database, declared the topology (%s, retry tiers 250ms/1s/2s), stocked the shop; no carrier serves %s", broker.QueueQuorum, unservedCountry)

	res, err := d.drive(ctx, *n)
	if err != nil {
		_ = stopHost()
		return err
	}
	res.elapsed = time.Since(began)
	problems, err := d.summarize(ctx, res)
	if err == nil && *nTrips > 0 {
		var tripProblems []string
		tripProblems, err = d.travel(ctx, *nTrips)
		problems = append(problems, tripProblems...)
	}
	if err == nil {
		err = d.repairHelp(ctx, c, *serve)
	}
	if err == nil && *serve {
		c.serveUntil(ctx, *serveFor)
	}
	if stopErr := stopHost(); err == nil && stopErr != nil {
		err = fmt.Errorf("run: %w", stopErr)
	}
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d saga(s) lost, stuck or off-script:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return nil
}

func (d *demo) event(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	d.events = append(d.events, line)
	fmt.Fprintf(d.out, "  - %s\n", line)
}

// plan decides what order i provokes: mostly happy, a few of each failure.
func plan(i int) kind {
	switch {
	case i == 7:
		return silentInv
	case i == 13:
		return latePayment
	case i == 17:
		return silentPay
	case i%25 == 5:
		return noStock
	case i%25 == 10:
		return declined
	case i%25 == 15:
		return flakyShip
	case i%50 == 20:
		return dupReply
	}
	return happy
}

type results struct {
	fleetElapsed time.Duration // start of the first saga until the regular fleet settled
	fleetSettled int
	elapsed      time.Duration
}

func (d *demo) request(o *order, i int) *orderv1.PlaceOrderRequest {
	products := []string{"widget", "gadget", "gizmo"}
	req := &orderv1.PlaceOrderRequest{
		OrderId:    o.id,
		CustomerId: fmt.Sprintf("customer-%03d", i%37),
		Lines: []*commonv1.OrderLine{
			{ProductId: products[i%3], Quantity: int32(1 + i%3)},
			{ProductId: products[(i+1)%3], Quantity: 1},
		},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: int64(1000 + 37*i)},
		ShippingAddress: &commonv1.Address{Name: "Customer", Street: "1 Demo Street", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       "tok_visa",
		CallbackUrl:     d.receiver.urlFor(o.id),
	}
	switch o.kind {
	case noStock:
		req.Lines = append(req.Lines, &commonv1.OrderLine{ProductId: "sold-out", Quantity: 1})
	case declined:
		req.CardToken = app.DeclinedCard
	case flakyShip:
		d.script.FailTransiently(o.id, shippingv1.ScheduleShippingInfo.FullName, 2)
	case dupReply:
		d.script.DuplicateReplies(o.id, paymentv1.AuthorizePaymentInfo.FullName)
	case silentInv:
		d.script.HoldReplies(o.id, inventoryv1.ReserveInventoryInfo.FullName)
	case latePayment, silentPay:
		d.script.HoldReplies(o.id, paymentv1.AuthorizePaymentInfo.FullName)
	case unserved:
		req.ShippingAddress.Country = unservedCountry
		req.ShippingAddress.City = "Reykjavík"
	}
	return req
}

// drive starts the fleet, injects the poison message, moves the clock and
// releases late replies, and waits for every saga to settle.
func (d *demo) drive(ctx context.Context, n int) (results, error) {
	var res results
	for i := 1; i <= n; i++ {
		d.orders = append(d.orders, &order{id: fmt.Sprintf("%s-%04d", d.runID, i), kind: plan(i)})
	}
	reqs := make([]*orderv1.PlaceOrderRequest, n)
	for i, o := range d.orders {
		reqs[i] = d.request(o, i+1)
	}
	fleetStart := time.Now()
	if err := d.startAll(ctx, reqs); err != nil {
		return res, err
	}
	d.event("started %d sagas (8 concurrent callers, each start one transaction: instance row + first command in the outbox)", n)
	if err := d.publishPoison(ctx); err != nil {
		return res, err
	}
	d.event("published %s%s: a ReserveInventory whose body is not protobuf, straight to the inventory queue", d.runID, poisonMsgID)

	regular := func(o *order) bool { return !clockNeeded[o.kind] }
	if err := d.waitSettled(ctx, regular, "the regular fleet to settle"); err != nil {
		return res, err
	}
	res.fleetElapsed = time.Since(fleetStart)
	for _, o := range d.orders {
		if regular(o) {
			res.fleetSettled++
		}
	}
	d.event("%d sagas without a silent participant settled in %s", res.fleetSettled, res.fleetElapsed.Round(time.Millisecond))

	silent, late, never := d.first(silentInv), d.first(latePayment), d.first(silentPay)
	for _, o := range []*order{silent, late, never} {
		if err := d.until(ctx, "a held reply for "+o.id, func() (bool, error) { return d.script.Held(o.id) >= 1, nil }); err != nil {
			return res, err
		}
	}
	if err := d.dueNow(ctx, silent, late, never); err != nil {
		return res, err
	}
	d.event("made the inventory timeout (30s) of %s and the payment timeout (1m) of %s and %s due now, instead of waiting", silent.id, late.id, never.id)
	if err := d.waitState(ctx, silent, orderv1.PlaceOrderStateFailed); err != nil {
		return res, err
	}
	d.event("%s: inventory timed out, its reservation was released (compensation), saga FAILED", silent.id)
	if err := d.until(ctx, "the resent payment commands to be held", func() (bool, error) {
		return d.script.Held(late.id) >= 2 && d.script.Held(never.id) >= 2, nil
	}); err != nil {
		return res, err
	}
	d.event("%s, %s: payment timed out, the saga resent AuthorizePayment; payment answered it from its first effect (no second authorization)", late.id, never.id)

	for _, o := range []*order{silent, late} {
		if _, err := d.script.SendHeldReply(ctx, d.pool, o.id); err != nil {
			return res, err
		}
	}
	d.event("%s: the lost InventoryReserved finally arrives (late; the release, sent after it, undid it: audited)", silent.id)
	d.event("%s: the answer to the first AuthorizePayment arrives while the saga waits for the second (late, applied)", late.id)
	if err := d.waitState(ctx, late, orderv1.PlaceOrderStateCompleted); err != nil {
		return res, err
	}
	if _, err := d.script.SendHeldReply(ctx, d.pool, late.id); err != nil {
		return res, err
	}
	d.event("%s: the answer to the resent AuthorizePayment arrives after all (a duplicate)", late.id)

	// Each fires one timeout: the second attempt's, then the last.
	for attempt := 3; attempt <= 4; attempt++ {
		if err := d.dueNow(ctx, never); err != nil {
			return res, err
		}
		if err := d.until(ctx, fmt.Sprintf("%s to time out again", never.id), func() (bool, error) {
			st, err := d.placeOrder.GetByID(ctx, never.sagaID)
			return err == nil && (st.Attempt >= attempt || st.State == orderv1.PlaceOrderStateManualReview), err
		}); err != nil {
			return res, err
		}
	}
	d.event("made %s's payment timeout due twice more: it used its 3 payment attempts and waits for an operator", never.id)

	// Last: an order no carrier ships.
	u := &order{id: fmt.Sprintf("%s-%04d", d.runID, n+1), kind: unserved}
	d.orders = append(d.orders, u)
	id, _, err := d.placeOrder.Start(ctx, d.request(u, n+1), message.Meta{})
	if err != nil {
		return res, fmt.Errorf("start order %s: %w", u.id, err)
	}
	u.sagaID = id
	if err := d.until(ctx, "the unservable shipping command to be parked", func() (bool, error) {
		var n int
		err := d.pool.QueryRow(ctx, `SELECT count(*) FROM saga_parked WHERE saga_id = $1 AND replayed_at IS NULL AND dismissed_at IS NULL`, u.sagaID).Scan(&n)
		return n == 1, err
	}); err != nil {
		return res, err
	}
	d.event("%s: ships to %s, where no carrier goes: ScheduleShipping parked at once (a permanent error), the saga waits for an operator", u.id, unservedCountry)

	if err := d.waitSettled(ctx, func(o *order) bool { return o.kind != unserved }, "every saga to settle"); err != nil {
		return res, err
	}
	// The late replies are audited after their sagas settled; wait for them
	// and for the outbox to drain before counting.
	if err := d.until(ctx, "late replies to be audited and the outbox to drain", func() (bool, error) {
		var lateRows, dupRows, unpublished int
		err := d.pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM saga_audit a WHERE a.saga_id = $1::uuid AND a.class = 'late'),
  (SELECT count(*) FROM saga_audit a WHERE a.saga_id = $2::uuid AND a.class = 'duplicate'),
  (SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL)`, silent.sagaID, late.sagaID).Scan(&lateRows, &dupRows, &unpublished)
		return lateRows >= 1 && dupRows >= 1 && unpublished == 0, err
	}); err != nil {
		return res, err
	}
	return res, nil
}

// dueNow makes the armed step timeouts of the orders due at once (their
// timeout_at set to now), so that the timeout scanner fires them at its
// next scan instead of after the contract's 30 s or 1 min.
func (d *demo) dueNow(ctx context.Context, orders ...*order) error {
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.sagaID
	}
	table := pgx.Identifier(strings.Split(d.placeOrder.Engine().Definition().Table, ".")).Sanitize()
	if _, err := d.pool.Exec(ctx, `UPDATE `+table+` SET timeout_at = $2 WHERE id = ANY($1::uuid[]) AND timeout_at IS NOT NULL`,
		ids, time.Now()); err != nil {
		return fmt.Errorf("make the timeouts of %v due: %w", ids, err)
	}
	return nil
}

func (d *demo) first(k kind) *order {
	for _, o := range d.orders {
		if o.kind == k {
			return o
		}
	}
	panic("demo: plan has no " + string(k)) // unreachable: run requires n >= 20, and plan covers every kind by 17
}

func (d *demo) startAll(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error {
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		firstErr error
		mu       sync.Mutex
	)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				id, _, err := d.placeOrder.Start(ctx, reqs[i], message.Meta{})
				if err != nil {
					mu.Lock()
					firstErr = errors.Join(firstErr, fmt.Errorf("start order %s: %w", reqs[i].GetOrderId(), err))
					mu.Unlock()
					return
				}
				d.orders[i].sagaID = id
			}
		})
	}
	wg.Wait()
	return firstErr
}

// publishPoison publishes a message no consumer can decode to the inventory's
// command exchange, as a broken client would.
func (d *demo) publishPoison(ctx context.Context) error {
	conn, err := broker.Dial(ctx, d.amqp, broker.ConnConfig{Name: "demo-poisoner"})
	if err != nil {
		return fmt.Errorf("poison: %w", err)
	}
	defer conn.Close()
	p := broker.NewPublisher(conn, broker.PublisherConfig{})
	defer p.Close()
	errs := p.Publish(ctx, []broker.Outgoing{{
		Exchange:   inventoryv1.ReserveInventoryInfo.Exchange,
		RoutingKey: inventoryv1.ReserveInventoryInfo.RoutingKey,
		Publishing: amqp.Publishing{
			MessageId:   d.runID + poisonMsgID,
			Type:        inventoryv1.ReserveInventoryInfo.FullName,
			ContentType: message.ContentType,
			Headers:     amqp.Table{message.HeaderSchemaVersion: int32(1)},
			Body:        []byte("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff not protobuf"),
		},
	}})
	if errs[0] != nil {
		return fmt.Errorf("publish poison message: %w", errs[0])
	}
	return nil
}

// until polls cond every 50ms for at most d.wait.
func (d *demo) until(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(d.wait)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s waiting for %s", d.wait, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *demo) waitState(ctx context.Context, o *order, state orderv1.PlaceOrderState) error {
	return d.until(ctx, fmt.Sprintf("%s to reach %s", o.id, state), func() (bool, error) {
		st, err := d.placeOrder.GetByID(ctx, o.sagaID)
		return err == nil && st.State == state, err
	})
}

// waitSettled waits until every selected saga is terminal or in manual
// review. A timeout is not an error here: the summary reports what is stuck.
func (d *demo) waitSettled(ctx context.Context, selected func(*order) bool, what string) error {
	err := d.until(ctx, what, func() (bool, error) {
		var open int
		err := d.pool.QueryRow(ctx, `SELECT count(*) FROM saga_place_order
WHERE business_key = ANY($1) AND state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'MANUAL_REVIEW')`,
			d.ids(selected)).Scan(&open)
		return open == 0, err
	})
	if err != nil && ctx.Err() == nil && strings.HasPrefix(err.Error(), "gave up") {
		d.event("%v", err)
		return nil
	}
	return err
}

func (d *demo) ids(selected func(*order) bool) []string {
	var out []string
	for _, o := range d.orders {
		if selected(o) {
			out = append(out, o.id)
		}
	}
	return out
}

// summarize prints the outcome and returns one line per saga that is lost,
// stuck or off-script.
func (d *demo) summarize(ctx context.Context, res results) ([]string, error) {
	w := d.out
	type row struct {
		key, review string
		state       orderv1.PlaceOrderState
		compensated bool
	}
	rows, err := d.pool.Query(ctx, `SELECT s.business_key, s.state, coalesce(s.review_reason, ''),
  EXISTS (SELECT 1 FROM saga_audit a WHERE a.saga_id = s.id AND a.to_state LIKE 'COMPENSATING_%')
FROM saga_place_order s WHERE s.business_key LIKE $1`, d.runID+"-%")
	if err != nil {
		return nil, fmt.Errorf("read sagas: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.key, &x.state, &x.review, &x.compensated)
	})
	if err != nil {
		return nil, fmt.Errorf("read sagas: %w", err)
	}
	byKey := map[string]row{}
	for _, r := range got {
		byKey[r.key] = r
	}
	var problems []string
	states := map[orderv1.PlaceOrderState]int{}
	failedCompensated, failedPlain := 0, 0
	reviews := map[string]int{}
	outcomes := map[kind]map[orderv1.PlaceOrderState]int{}
	for _, o := range d.orders {
		r, ok := byKey[o.id]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s (%s): lost, no saga instance", o.id, o.kind))
			continue
		}
		states[r.state]++
		if outcomes[o.kind] == nil {
			outcomes[o.kind] = map[orderv1.PlaceOrderState]int{}
		}
		outcomes[o.kind][r.state]++
		switch {
		case r.state == orderv1.PlaceOrderStateFailed && r.compensated:
			failedCompensated++
		case r.state == orderv1.PlaceOrderStateFailed:
			failedPlain++
		case r.state == orderv1.PlaceOrderStateManualReview:
			reviews[r.review]++
		}
		if r.state != expected[o.kind] {
			what := "off-script"
			if !r.state.Terminal() && r.state != orderv1.PlaceOrderStateManualReview {
				what = "stuck"
			}
			problems = append(problems, fmt.Sprintf("%s (%s): %s in %s, want %s", o.id, o.kind, what, r.state, expected[o.kind]))
		}
	}

	// Every order that reached an outcome the contract calls back is told
	// so, verified by the receiver.
	want := map[string]string{}
	for _, o := range d.orders {
		switch st := byKey[o.id].state; st {
		case orderv1.PlaceOrderStateCompleted, orderv1.PlaceOrderStateFailed, orderv1.PlaceOrderStateManualReview:
			want[o.id] = string(st)
		}
	}
	problems = append(problems, d.awaitCallbacks(ctx, want)...)
	cbStates, cbDupes, cbRefused := d.receiver.counts()

	var audit struct{ duplicates, late, transitions int }
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE a.class = 'duplicate'), count(*) FILTER (WHERE a.class = 'late'),
  count(*) FILTER (WHERE a.class = 'new')
FROM saga_audit a JOIN saga_place_order s ON s.id = a.saga_id WHERE s.business_key LIKE $1`, d.runID+"-%").
		Scan(&audit.duplicates, &audit.late, &audit.transitions); err != nil {
		return nil, fmt.Errorf("read audit: %w", err)
	}
	var outboxRows, unpublished int
	if err := d.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE o.published_at IS NULL)
FROM saga_outbox_state o JOIN saga_place_order s ON o.saga_id = s.id::text WHERE s.business_key LIKE $1`, d.runID+"-%").
		Scan(&outboxRows, &unpublished); err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	if unpublished > 0 {
		problems = append(problems, fmt.Sprintf("%d outbox rows of this run are still unpublished", unpublished))
	}
	type parkedRow struct{ id, queue, class, reason string }
	prow, err := d.pool.Query(ctx, `SELECT message_id, queue, class, reason FROM saga_parked
WHERE message_id LIKE $1 OR saga_id IN (SELECT id::text FROM saga_place_order WHERE business_key LIKE $1) ORDER BY id`, d.runID+"-%")
	if err != nil {
		return nil, fmt.Errorf("read parked messages: %w", err)
	}
	parked, err := pgx.CollectRows(prow, func(r pgx.CollectableRow) (parkedRow, error) {
		var p parkedRow
		return p, r.Scan(&p.id, &p.queue, &p.class, &p.reason)
	})
	if err != nil {
		return nil, fmt.Errorf("read parked messages: %w", err)
	}
	if len(parked) != 2 || parked[0].id != d.runID+poisonMsgID || parked[1].queue != "shipping.commands" {
		problems = append(problems, fmt.Sprintf("want the poison message and the unservable shipping command parked, got %d parked messages", len(parked)))
	}
	var shippingRetries int
	for _, o := range d.orders {
		if n := d.script.Deliveries(o.id, shippingv1.ScheduleShippingInfo.FullName); n > 1 {
			shippingRetries += n - 1
		}
	}

	fmt.Fprintf(w, "\nSummary\n")
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  sagas started\t%d\n", len(d.orders))
	fmt.Fprintf(tw, "  completed\t%d\n", states[orderv1.PlaceOrderStateCompleted])
	fmt.Fprintf(tw, "  failed and compensated\t%d\t(a later step failed or timed out; inventory released)\n", failedCompensated)
	fmt.Fprintf(tw, "  failed, nothing to undo\t%d\t(inventory refused the order)\n", failedPlain)
	fmt.Fprintf(tw, "  in manual review\t%d\n", states[orderv1.PlaceOrderStateManualReview])
	for _, reason := range sortedKeys(reviews) {
		fmt.Fprintf(tw, "    %d×\t%s\n", reviews[reason], reason)
	}
	waiting := outcomes[unserved][orderv1.PlaceOrderStateScheduleShipping]
	fmt.Fprintf(tw, "  waiting for an operator\t%d\t(its shipping command is parked; repair it below)\n", waiting)
	other := len(got) - states[orderv1.PlaceOrderStateCompleted] - states[orderv1.PlaceOrderStateFailed] - states[orderv1.PlaceOrderStateManualReview] - waiting
	fmt.Fprintf(tw, "  still running or lost\t%d\n", other+len(d.orders)-len(got))
	fmt.Fprintf(tw, "  parked messages\t%d\n", len(parked))
	for _, p := range parked {
		fmt.Fprintf(tw, "    %s\t%s from %s: %s\n", p.id, p.class, p.queue, p.reason)
	}
	fmt.Fprintf(tw, "  duplicate replies absorbed\t%d\t(audited, no effect)\n", audit.duplicates)
	fmt.Fprintf(tw, "  late replies\t%d\t(handled by each step's late-reply policy)\n", audit.late)
	fmt.Fprintf(tw, "  shipping retries\t%d\t(through the TTL retry tiers, then success)\n", shippingRetries)
	fmt.Fprintf(tw, "  transitions audited\t%d\n", audit.transitions)
	var booked int
	carriers := d.manifests.Carriers()
	for _, c := range carriers {
		booked += len(d.manifests.Orders(c))
	}
	fmt.Fprintf(tw, "  carrier manifests\t%d\t(bookings on %d carriers' manifests, each written under the carrier's fenced lease: docs/locks.md)\n", booked, len(carriers))
	fmt.Fprintf(tw, "  callbacks verified\t%d\t(completed %d, failed %d, manual review %d; signed, checked by the demo's receiver; %d redelivered copies deduplicated by id, %d refused)\n",
		cbStates["COMPLETED"]+cbStates["FAILED"]+cbStates["MANUAL_REVIEW"], cbStates["COMPLETED"], cbStates["FAILED"], cbStates["MANUAL_REVIEW"], cbDupes, cbRefused)
	rs := d.host.RelayStats()
	fmt.Fprintf(tw, "  outbox rows\t%d\t(%d unpublished; relays published %d messages; %d rows were handed to them after their commit instead of claimed)\n",
		outboxRows, unpublished, rs.Published, rs.HandedOff)
	fmt.Fprintf(tw, "  elapsed\t%s\n", res.elapsed.Round(time.Millisecond))
	if res.fleetElapsed > 0 {
		fmt.Fprintf(tw, "  throughput\t%.0f sagas/s\t(%d sagas settled in %s, before any timeout fired)\n",
			float64(res.fleetSettled)/res.fleetElapsed.Seconds(), res.fleetSettled, res.fleetElapsed.Round(time.Millisecond))
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\nBy scenario (state: count)\n")
	for _, k := range []kind{happy, noStock, declined, flakyShip, dupReply, silentInv, latePayment, silentPay, unserved} {
		var parts []string
		for _, s := range sortedKeys(outcomes[k]) {
			parts = append(parts, fmt.Sprintf("%s: %d", s, outcomes[k][s]))
		}
		fmt.Fprintf(w, "  %-26s %s\n", k, strings.Join(parts, ", "))
	}

	fmt.Fprintf(w, `
Where to look next (psql "%[4]s")
  SELECT state, count(*) FROM saga_place_order WHERE business_key LIKE '%[1]s-%%' GROUP BY 1;
  SELECT from_state, to_state, trigger, class, note FROM saga_audit
    WHERE saga_id = (SELECT id FROM saga_place_order WHERE business_key = '%[2]s') ORDER BY id;
  SELECT business_key, review_reason FROM saga_place_order WHERE state = 'MANUAL_REVIEW';
  SELECT message_id, queue, class, reason FROM saga_parked ORDER BY id DESC;
  SELECT order_id, service, effect, detail FROM shop_ledger WHERE order_id = '%[2]s' ORDER BY id;
  go run ./cmd/sagactl migrate -status -database-url "%[4]s"
Parked messages also wait in RabbitMQ queue %[3]s (management UI).
make demo stops the services it started when it exits; to keep them afterwards:
  make services-start && source /tmp/saga-services/env.sh && make demo
`, d.runID, d.first(declined).id, broker.ParkingQueue("inventory.commands"), d.pgURL)
	return problems, nil
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
