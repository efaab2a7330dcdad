package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/broker"
)

// Report is what one soak run did and what it proved.
type Report struct {
	Seed     uint64
	Duration time.Duration // first node start to settled

	Sagas  int            // started by the driver
	States map[string]int // final state → sagas
	// ManualReview counts sagas left in manual review; each has a reason.
	ManualReview int
	// ReviewReasons counts manual reviews by reason (first 60 bytes).
	ReviewReasons map[string]int

	Nodes          int
	NodeStarts     int            // every start, restarts included
	Kills          map[string]int // "crash:<point>" or "random"
	ServerRestarts map[string]int // "broker", "postgres"
	Faults         map[string]int // injected participant faults by kind (Fault*)

	AuditRows   int
	Duplicates  int // audited duplicate deliveries to the saga (absorbed)
	Late        int // audited late replies
	Conflicting int
	Parked      int            // saga_parked rows
	ParkedBy    map[string]int // by class
	OutboxRows  int
	Redelivered int // outbox rows leased more than once (attempts > 1): published twice, or released unsent and published later
	HandedOff   int // outbox rows a consumer handed to its node's relay (lease born with the insert)

	// Callbacks are the distinct callbacks the soak's receiver verified and
	// processed; CallbackDuplicates the verified deliveries of an id it had
	// processed already (deduplicated); CallbackRequests every request.
	Callbacks, CallbackDuplicates, CallbackRequests int

	Lost          int // started sagas without a row, messages neither consumed nor parked, outcomes not called back
	DoubleEffects int // business effects applied more than once

	// Types are the figures of each saga type (PlaceOrder, BookTrip).
	Types map[string]*SagaFigures

	Throughput  float64 // sagas ended per second of the run
	SagaLatency Latency // start → end of each saga that ended without manual review
	StepLatency map[string]Latency
	RSS         []ProcRSS

	Violations []string
}

// SagaFigures are one saga type's share of a Report.
type SagaFigures struct {
	Sagas         int            // started by the driver
	States        map[string]int // final state → sagas
	ManualReview  int
	Lost          int
	DoubleEffects int
}

// typ returns the figures of saga type t, created on first use.
func (rep *Report) typ(t string) *SagaFigures {
	if rep.Types == nil {
		rep.Types = map[string]*SagaFigures{}
	}
	f := rep.Types[t]
	if f == nil {
		f = &SagaFigures{States: map[string]int{}}
		rep.Types[t] = f
	}
	return f
}

// lost counts n lost things of saga type t.
func (rep *Report) lost(t string, n int) {
	rep.Lost += n
	rep.typ(t).Lost += n
}

// double counts n business effects of saga type t applied once too often.
func (rep *Report) double(t string, n int) {
	rep.DoubleEffects += n
	rep.typ(t).DoubleEffects += n
}

// sagaOfMessage names the saga type a message type belongs to: the Place
// Order example's messages are in the shop.* packages, the rest are the
// travel example's (its child Payment's counted with Book Trip).
func sagaOfMessage(messageType string) string {
	if strings.HasPrefix(messageType, "shop.") {
		return sagaPlaceOrder
	}
	return sagaBookTrip
}

// Latency summarizes a latency distribution.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

// ProcRSS summarizes one node incarnation's resident set size.
type ProcRSS struct {
	Node        string
	Incarnation int
	Life        time.Duration
	Early, Late int64 // KiB: median of the second quarter, median of the last quarter of samples
	Max         int64 // KiB
	Growth      float64
	LongEnough  bool // sampled long enough to judge
}

func (rep *Report) violate(format string, args ...any) {
	const limit = 40
	if len(rep.Violations) == limit {
		rep.Violations = append(rep.Violations, "... (more violations not listed)")
	}
	if len(rep.Violations) > limit {
		return
	}
	rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
}

type sagaRow struct {
	typ                    string // sagaPlaceOrder or sagaBookTrip
	id, key, state, reason string
	version                int64
	created                time.Time
}

type auditRow struct {
	from, to, trigger, class string
	version                  int64
	at                       time.Time
}

// check verifies the invariants from the database (saga rows, audit trail,
// outbox, inbox, parking records, the services' ledgers and stock) and the
// broker (queues and parking lots), with the fleet stopped.
func (r *run) check(ctx context.Context) (*Report, error) {
	rep := &Report{
		Seed: r.cfg.Seed, States: map[string]int{}, ReviewReasons: map[string]int{}, ParkedBy: map[string]int{},
		StepLatency: map[string]Latency{},
	}
	r.mu.Lock()
	orders := slices.Clone(r.orders)
	r.mu.Unlock()
	rep.Sagas = len(orders)
	rep.typ(sagaPlaceOrder)
	for _, o := range orders {
		rep.typ(o.saga).Sagas++
	}

	// Sagas: none lost, each ended with a reason.
	sagas := map[string]sagaRow{}
	for _, table := range []struct{ typ, name string }{{sagaPlaceOrder, "saga_place_order"}, {sagaBookTrip, "saga_book_trip"}} {
		rows, err := r.pool.Query(ctx, `SELECT id::text, business_key, state, coalesce(review_reason, ''), version, created_at FROM `+table.name)
		if err != nil {
			return nil, fmt.Errorf("check: sagas of %s: %w", table.name, err)
		}
		s := sagaRow{typ: table.typ}
		if _, err := pgx.ForEachRow(rows, []any{&s.id, &s.key, &s.state, &s.reason, &s.version, &s.created}, func() error {
			sagas[s.key] = s
			return nil
		}); err != nil {
			return nil, fmt.Errorf("check: sagas of %s: %w", table.name, err)
		}
	}
	for _, o := range orders {
		row, ok := sagas[o.id]
		if !ok {
			rep.lost(o.saga, 1)
			rep.violate("%s %s (%s): no saga", o.saga, o.id, o.kind)
			continue
		}
		if row.id != o.sagaID {
			rep.violate("order %s: saga %s, but Start returned %s", o.id, row.id, o.sagaID)
		}
	}
	if len(sagas) != len(orders) {
		rep.violate("%d sagas in the table for %d orders started", len(sagas), len(orders))
	}
	// The Payment sagas Book Trip starts as children, keyed by their trip
	// (their business key) in children, and in sagas as "payment:<trip>"
	// for the checks every saga passes.
	children := map[string]sagaRow{}
	rows, err := r.pool.Query(ctx, `SELECT id::text, business_key, state, coalesce(review_reason, ''), version, created_at FROM saga_payment`)
	if err != nil {
		return nil, fmt.Errorf("check: sagas of saga_payment: %w", err)
	}
	child := sagaRow{typ: sagaPayment}
	if _, err := pgx.ForEachRow(rows, []any{&child.id, &child.key, &child.state, &child.reason, &child.version, &child.created}, func() error {
		children[child.key] = child
		sagas["payment:"+child.key] = child
		return nil
	}); err != nil {
		return nil, fmt.Errorf("check: sagas of saga_payment: %w", err)
	}
	rep.typ(sagaPayment).Sagas = len(children)
	for _, sg := range sagas {
		if sg.typ != sagaPayment { // children are not started by the driver
			rep.States[sg.state]++
		}
		rep.typ(sg.typ).States[sg.state]++
		switch sg.state {
		case "COMPLETED", "FAILED", "CANCELLED":
		case "MANUAL_REVIEW":
			if sg.typ != sagaPayment {
				rep.ManualReview++
			}
			rep.typ(sg.typ).ManualReview++
			if strings.TrimSpace(sg.reason) == "" {
				rep.violate("saga %s (%s) is in manual review without a reason", sg.id, sg.key)
			}
			reason := sg.reason
			if len(reason) > 60 {
				reason = reason[:60]
			}
			rep.ReviewReasons[reason]++
		default:
			rep.violate("saga %s (%s) did not end: %s", sg.id, sg.key, sg.state)
		}
	}

	// Every transition audited: the audit trail of each saga is an
	// unbroken chain of versions ending in its current state.
	audits := map[string][]auditRow{}
	rows, err = r.pool.Query(ctx, `SELECT saga_id::text, from_state, to_state, trigger, class, version, at FROM saga_audit ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("check: audit: %w", err)
	}
	var sid string
	var a auditRow
	if _, err := pgx.ForEachRow(rows, []any{&sid, &a.from, &a.to, &a.trigger, &a.class, &a.version, &a.at}, func() error {
		audits[sid] = append(audits[sid], a)
		rep.AuditRows++
		switch a.class {
		case "duplicate":
			rep.Duplicates++
		case "late":
			rep.Late++
		case "conflicting":
			rep.Conflicting++
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("check: audit: %w", err)
	}
	for _, sg := range sagas {
		checkAuditChain(rep, sg, audits[sg.id])
	}
	r.latencies(rep, sagas, audits)

	// Business effects: none twice; compensation exactly for the completed
	// compensatable step, after it; stock conserved.
	ledger := map[string][]string{}
	rows, err = r.pool.Query(ctx, `SELECT order_id, service || ':' || effect FROM shop_ledger ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("check: ledger: %w", err)
	}
	var orderID, effect string
	if _, err := pgx.ForEachRow(rows, []any{&orderID, &effect}, func() error {
		ledger[orderID] = append(ledger[orderID], effect)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("check: ledger: %w", err)
	}
	for _, o := range orders {
		if sg, ok := sagas[o.id]; ok && o.saga == sagaPlaceOrder {
			checkLedger(rep, o, sg, ledger[o.id])
		}
	}
	if err := r.checkStock(ctx, rep, sagas); err != nil {
		return nil, err
	}
	placed := map[string]sagaRow{} // only Place Order registers callbacks
	for key, sg := range sagas {
		if sg.typ == sagaPlaceOrder {
			placed[key] = sg
		}
	}
	if err := r.checkCallbacks(ctx, rep, placed); err != nil {
		return nil, err
	}
	// The travel example's effects and inventory.
	if err := r.checkTrips(ctx, rep, orders, sagas, children); err != nil {
		return nil, err
	}

	// Messages: every committed outbox row published, and consumed (inbox)
	// or parked by every queue it was routed to.
	if err := r.checkMessages(ctx, rep); err != nil {
		return nil, err
	}
	// Broker: nothing left in work or retry queues; parking lots hold
	// exactly the parked messages.
	if err := r.checkQueues(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func checkAuditChain(rep *Report, sg sagaRow, trail []auditRow) {
	if len(trail) == 0 {
		rep.violate("saga %s (%s): no audit rows", sg.id, sg.key)
		return
	}
	if f := trail[0]; f.from != "" || f.version != 1 || f.trigger != "start" {
		rep.violate("saga %s: first audit row is %s -> %s on %s (version %d), not the start", sg.id, f.from, f.to, f.trigger, f.version)
	}
	state, version := trail[0].to, int64(1)
	for _, a := range trail[1:] {
		switch a.version {
		case version + 1:
			if a.from != state {
				rep.violate("saga %s: transition to version %d starts from %s, but the previous one ended in %s", sg.id, a.version, a.from, state)
			}
			state, version = a.to, a.version
		case version:
			if a.from != state || a.to != state {
				rep.violate("saga %s: audit row %s -> %s (%s, %s) changes the state without a new version", sg.id, a.from, a.to, a.trigger, a.class)
			}
		default:
			rep.violate("saga %s: audit jumps from version %d to %d (%s -> %s on %s): a transition was not audited",
				sg.id, version, a.version, a.from, a.to, a.trigger)
			state, version = a.to, a.version
		}
	}
	if version != sg.version || state != sg.state {
		rep.violate("saga %s: audit ends in %s (version %d), the saga is in %s (version %d)", sg.id, state, version, sg.state, sg.version)
	}
}

// Ledger effects, as "service:effect".
const (
	effReserved   = "inventory:reserved"
	effRefused    = "inventory:reservation_refused"
	effReleased   = "inventory:released"
	effReleasedNo = "inventory:released_nothing"
	effAuthorized = "payment:authorized"
	effDeclined   = "payment:declined"
	effBooked     = "shipping:booked"
	effApproved   = "order:approved"
)

func checkLedger(rep *Report, o *order, sg sagaRow, effects []string) {
	count := map[string]int{}
	pos := map[string]int{}
	for i, e := range effects {
		count[e]++
		pos[e] = i
	}
	for e, n := range count {
		if n > 1 {
			rep.double(sagaPlaceOrder, n-1)
			rep.violate("order %s: %s applied %d times: %v", o.id, e, n, effects)
		}
	}
	once := func(a, b string) {
		if count[a] > 0 && count[b] > 0 {
			rep.double(sagaPlaceOrder, 1)
			rep.violate("order %s: both %s and %s: %v", o.id, a, b, effects)
		}
	}
	once(effReserved, effRefused)
	once(effAuthorized, effDeclined)
	once(effReleased, effReleasedNo)
	before := func(a, b string) {
		if count[b] > 0 && (count[a] == 0 || pos[a] > pos[b]) {
			rep.violate("order %s: %s without %s before it: %v", o.id, b, a, effects)
		}
	}
	before(effReserved, effAuthorized)
	before(effAuthorized, effBooked)
	before(effBooked, effApproved)
	before(effReserved, effReleased)
	switch sg.state {
	case "COMPLETED":
		want := []string{effReserved, effAuthorized, effBooked, effApproved}
		if !slices.Equal(effects, want) {
			rep.violate("order %s completed with effects %v, want %v", o.id, effects, want)
		}
	case "FAILED":
		for _, e := range []string{effAuthorized, effBooked, effApproved} {
			if count[e] > 0 {
				rep.violate("order %s failed after %s (past the pivot): %v", o.id, e, effects)
			}
		}
		// The one compensatable step is compensated exactly when it
		// completed, and its compensation comes after every forward effect.
		if count[effReserved] > 0 && count[effReleased] == 0 {
			rep.violate("order %s failed with its reservation never released: %v", o.id, effects)
		}
		if count[effReleased] > 0 {
			for _, e := range []string{effReserved, effDeclined} {
				if count[e] > 0 && pos[e] > pos[effReleased] {
					rep.violate("order %s: %s after the compensation: %v", o.id, e, effects)
				}
			}
		}
		switch o.kind {
		case kindSoldOut:
			if count[effReserved] > 0 {
				rep.violate("order %s holds a sold-out product: %v", o.id, effects)
			}
		case kindOK:
			// Fails only through a timeout of the reservation.
			if count[effDeclined] > 0 {
				rep.violate("order %s with a good card was declined: %v", o.id, effects)
			}
		}
	case "MANUAL_REVIEW":
		// Any prefix of the path may have happened; the checks above
		// (once, in order) hold, and an operator decides the rest.
	}
	if o.kind == kindOK && sg.state == "FAILED" && count[effRefused] > 0 && count[effReleasedNo] == 0 {
		rep.violate("order %s with stock was refused without a prior release: %v", o.id, effects)
	}
}

// checkStock verifies that every unit of stock is on the shelf or held by an
// unreleased reservation, and that only completed sagas or sagas in manual
// review hold any.
func (r *run) checkStock(ctx context.Context, rep *Report, sagas map[string]sagaRow) error {
	rows, err := r.pool.Query(ctx, `SELECT s.product_id, s.available,
  coalesce((SELECT sum(quantity) FROM inventory_reservations r WHERE r.product_id = s.product_id AND r.released_at IS NULL), 0)
FROM inventory_stock s`)
	if err != nil {
		return fmt.Errorf("check: stock: %w", err)
	}
	var p string
	var available, held int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &available, &held}, func() error {
		initial := int64(initialStock)
		if p == soldOut {
			initial = 0
		}
		if available+held != initial {
			rep.violate("stock of %s: %d on the shelf + %d held != %d", p, available, held, initial)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("check: stock: %w", err)
	}
	rows, err = r.pool.Query(ctx, `SELECT DISTINCT order_id FROM inventory_reservations WHERE released_at IS NULL AND quantity > 0`)
	if err != nil {
		return fmt.Errorf("check: reservations: %w", err)
	}
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("check: reservations: %w", err)
	}
	for _, id := range holders {
		if st := sagas[id].state; st != "COMPLETED" && st != "MANUAL_REVIEW" {
			rep.violate("order %s holds stock in state %q", id, st)
		}
	}
	return nil
}

// checkMessages verifies the message path end to end: every outbox row was
// published, and every queue its binding routes it to consumed it (inbox)
// or parked it.
func (r *run) checkMessages(ctx context.Context, rep *Report) error {
	routes := map[[2]string][]string{} // exchange, routing key → queues
	for _, b := range Topology(broker.QueueQuorum, retryPolicy).Bindings {
		k := [2]string{b.Exchange, b.RoutingKey}
		routes[k] = append(routes[k], b.Queue)
	}
	rows, err := r.pool.Query(ctx, `SELECT o.message_id, o.exchange, o.routing_key, o.message_type,
  s.id IS NOT NULL AND p.id IS NULL, coalesce(p.attempts, s.attempts, o.attempts)
FROM saga_outbox o LEFT JOIN saga_outbox_sent s ON s.id = o.id LEFT JOIN saga_outbox_pending p ON p.id = o.id`)
	if err != nil {
		return fmt.Errorf("check: outbox: %w", err)
	}
	type out struct {
		id, exchange, key, typ string
		published              bool
		attempts               int
	}
	var all []out
	var o out
	if _, err := pgx.ForEachRow(rows, []any{&o.id, &o.exchange, &o.key, &o.typ, &o.published, &o.attempts}, func() error {
		all = append(all, o)
		return nil
	}); err != nil {
		return fmt.Errorf("check: outbox: %w", err)
	}
	rep.OutboxRows = len(all)
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox o JOIN saga_outbox_sent s ON s.id = o.id
WHERE o.lease_owner = s.relay AND s.attempts = 1 AND o.lease_until = o.created_at + $1 * interval '1 millisecond'`,
		relayLease.Milliseconds()).Scan(&rep.HandedOff); err != nil {
		return fmt.Errorf("check: outbox hand-offs: %w", err)
	}
	seen := map[[2]string]bool{}
	for _, q := range []string{`SELECT consumer, message_id FROM saga_inbox`, `SELECT queue, message_id FROM saga_parked`} {
		rows, err := r.pool.Query(ctx, q)
		if err != nil {
			return fmt.Errorf("check: inbox: %w", err)
		}
		var c, id string
		if _, err := pgx.ForEachRow(rows, []any{&c, &id}, func() error {
			seen[[2]string{c, id}] = true
			return nil
		}); err != nil {
			return fmt.Errorf("check: inbox: %w", err)
		}
	}
	// A participant's queue claims nothing in the inbox for a command that
	// ran: its once record names the message id instead. Nor does a saga's
	// queue for a message its engine applied: its audit row names it.
	ran := map[string]bool{}
	rows, err = r.pool.Query(ctx, `SELECT message_id FROM saga_participant_once WHERE message_id <> ''
UNION SELECT message_id FROM saga_audit WHERE message_id <> ''`)
	if err != nil {
		return fmt.Errorf("check: once records: %w", err)
	}
	var ranID string
	if _, err := pgx.ForEachRow(rows, []any{&ranID}, func() error {
		ran[ranID] = true
		return nil
	}); err != nil {
		return fmt.Errorf("check: once records: %w", err)
	}
	for _, o := range all {
		if o.attempts > 1 {
			rep.Redelivered++
		}
		if !o.published {
			rep.lost(sagaOfMessage(o.typ), 1)
			rep.violate("outbox row %s (%s) committed and never published", o.id, o.typ)
			continue
		}
		queues := routes[[2]string{o.exchange, o.key}]
		if len(queues) == 0 {
			rep.violate("outbox row %s (%s) routes to no queue", o.id, o.typ)
		}
		for _, q := range queues {
			if !seen[[2]string{q, o.id}] && !ran[o.id] {
				rep.lost(sagaOfMessage(o.typ), 1)
				rep.violate("message %s (%s) published to %s was neither consumed nor parked there", o.id, o.typ, q)
			}
		}
	}

	// Parked messages: each with a reason and a saga.
	rows, err = r.pool.Query(ctx, `SELECT message_id, queue, class, reason, saga_id FROM saga_parked`)
	if err != nil {
		return fmt.Errorf("check: parked: %w", err)
	}
	var id, queue, class, reason, sagaID string
	if _, err := pgx.ForEachRow(rows, []any{&id, &queue, &class, &reason, &sagaID}, func() error {
		rep.Parked++
		rep.ParkedBy[class]++
		if strings.TrimSpace(reason) == "" {
			rep.violate("parked message %s on %s has no reason", id, queue)
		}
		if sagaID == "" {
			rep.violate("parked message %s on %s (%s) names no saga", id, queue, reason)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("check: parked: %w", err)
	}
	return nil
}

// checkQueues verifies that the fleet left no message behind: work and retry
// queues are empty and hold nothing unacknowledged, and each parking lot
// holds exactly the messages saga_parked records for its queue.
func (r *run) checkQueues(ctx context.Context, rep *Report) error {
	// The management API's counters lag up to a collection interval.
	var qs []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		stats, err := r.cfg.Services.Queues(ctx, r.vhost)
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		var busy []string
		qs = qs[:0]
		for _, q := range stats {
			qs = append(qs, q.Name)
			if !isParking(q.Name) && (q.Messages > 0 || q.Unacknowledged > 0) {
				busy = append(busy, fmt.Sprintf("%s: %d messages, %d unacknowledged", q.Name, q.Messages, q.Unacknowledged))
			}
		}
		if len(busy) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, b := range busy {
				rep.violate("queue %s left behind", b)
			}
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var conn *amqp.Connection
	var err error
	for u := range strings.SplitSeq(r.amqp, ",") { // the first node that answers
		if conn, err = amqp.Dial(u); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("check: dial broker: %w", err)
	}
	defer conn.Close()
	for _, q := range qs {
		if !isParking(q) {
			continue
		}
		origin := strings.TrimSuffix(q, ".parking")
		inBroker, err := peekIDs(conn, q)
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		rows, err := r.pool.Query(ctx, `SELECT DISTINCT message_id FROM saga_parked WHERE queue = $1 AND replayed_at IS NULL AND dismissed_at IS NULL`, origin)
		if err != nil {
			return fmt.Errorf("check: parked of %s: %w", origin, err)
		}
		inDB, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("check: parked of %s: %w", origin, err)
		}
		sort.Strings(inDB)
		if !slices.Equal(inBroker, inDB) {
			rep.violate("parking lot %s holds %v, saga_parked records %v", q, inBroker, inDB)
		}
	}
	return nil
}

// peekIDs returns the distinct message ids in a queue, leaving the messages
// there (they return when the channel closes unacknowledged).
func peekIDs(conn *amqp.Connection, queue string) ([]string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("peek %s: %w", queue, err)
	}
	defer ch.Close()
	seen := map[string]bool{}
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return nil, fmt.Errorf("peek %s: %w", queue, err)
		}
		if !ok {
			break
		}
		seen[d.MessageId] = true
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func isParking(queue string) bool { return strings.HasSuffix(queue, ".parking") }
