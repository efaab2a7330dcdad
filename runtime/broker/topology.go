package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/retry"
)

// QueueType is RabbitMQ's x-queue-type.
type QueueType string

// Queue types. Quorum queues are replicated and the default; classic queues
// suit single-node development brokers.
const (
	QueueQuorum  QueueType = "quorum"
	QueueClassic QueueType = "classic"
)

// Queue and exchange arguments the topology sets.
const (
	ArgQueueType            = "x-queue-type"
	ArgMessageTTL           = "x-message-ttl"
	ArgDeadLetterExchange   = "x-dead-letter-exchange"
	ArgDeadLetterRoutingKey = "x-dead-letter-routing-key"
	ArgDeadLetterStrategy   = "x-dead-letter-strategy"
	ArgOverflow             = "x-overflow"
)

// Exchange is a durable exchange. Kind is "topic" when empty.
type Exchange struct{ Name, Kind string }

// Queue is a durable queue. Type is QueueQuorum when empty; Args are extra
// x-arguments (Type wins over an x-queue-type in Args).
type Queue struct {
	Name string
	Type QueueType
	Args amqp.Table
}

// Binding routes messages published to Exchange with a matching RoutingKey
// (a topic pattern for topic exchanges) into Queue.
type Binding struct{ Queue, Exchange, RoutingKey string }

// Topology is a set of exchanges, queues and bindings to declare together.
type Topology struct {
	Exchanges []Exchange
	Queues    []Queue
	Bindings  []Binding
}

// TierQueue names the retry tier of queue whose messages wait ttl:
// "<queue>.retry.<ttl>", with ttl written in its largest whole unit (h, m,
// s, or ms), e.g. "orders.retry.10s", "orders.retry.1500ms".
func TierQueue(queue string, ttl time.Duration) string {
	return queue + ".retry." + formatTTL(ttl)
}

// ParkingQueue names the parking lot of queue: "<queue>.parking".
func ParkingQueue(queue string) string { return queue + ".parking" }

func formatTTL(d time.Duration) string {
	switch {
	case d > 0 && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d > 0 && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d > 0 && d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	default:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
}

// WorkQueue returns a work queue with its retry machinery: the queue itself,
// one tier queue per distinct delay p can ask for (see TierQueue), and its
// parking lot (see ParkingQueue), all of type qt. A zero policy means
// retry.Default().
//
// A tier queue has no consumer. A consumer that wants to retry a delivery
// publishes it to the tier through the default exchange (routing key = the
// tier queue's name) and acks the original; when the message's TTL
// (x-message-ttl) expires the broker dead-letters it through the default
// exchange (x-dead-letter-exchange "") with routing key = the work queue
// (x-dead-letter-routing-key), so it is delivered again. Each tier holds
// one TTL, so no message waits behind a longer-lived one. Quorum tier
// queues dead-letter at-least-once (x-dead-letter-strategy), so an expiring
// message cannot be lost on its way back.
//
// A quorum work queue dead-letters into its parking lot, at-least-once: a
// message the broker gives up on goes there instead of being dropped.
// RabbitMQ 4 gives quorum queues a delivery limit (20 by default; 3.x has
// none unless a policy or x-delivery-limit sets one): a message returned
// unacknowledged that many times (its handling killed the consumer each
// time, or a client nacked it) is dead-lettered, and without a dead-letter
// target it would be lost. The consumer's own guard (consumer
// Config.MaxRedeliveries, 10 by default) parks such a message first, with a
// saga_parked row; the broker's limit is the backstop, and a message it
// parks carries x-death (reason "delivery_limit") and no saga_parked row.
// A work queue that exists without these arguments (declared by an older
// version) is refused by Declare; see [LegacyWorkQueue] for the upgrade.
func WorkQueue(name string, qt QueueType, p retry.Policy) []Queue {
	if p.IsZero() {
		p = retry.Default()
	}
	qt = orQuorum(qt)
	var ttls []time.Duration
	for attempt := 1; ; attempt++ {
		d, ok := p.TierFor(attempt)
		if !ok {
			break
		}
		if !slices.Contains(ttls, d) {
			ttls = append(ttls, d)
		}
		if d == p.Tiers[len(p.Tiers)-1] {
			break // the last tier is reused from here on
		}
	}
	slices.Sort(ttls)
	work := Queue{Name: name, Type: qt}
	if qt == QueueQuorum {
		work.Args = parkingArgs(name)
	}
	qs := []Queue{work}
	for _, d := range ttls {
		args := amqp.Table{
			ArgMessageTTL:           d.Milliseconds(),
			ArgDeadLetterExchange:   "",
			ArgDeadLetterRoutingKey: name,
		}
		if qt == QueueQuorum {
			args[ArgDeadLetterStrategy] = "at-least-once"
			args[ArgOverflow] = "reject-publish" // required by at-least-once
		}
		qs = append(qs, Queue{Name: TierQueue(name, d), Type: qt, Args: args})
	}
	return append(qs, Queue{Name: ParkingQueue(name), Type: qt})
}

// parkingArgs are the arguments that make quorum work queue name
// dead-letter into its parking lot (see WorkQueue).
func parkingArgs(name string) amqp.Table {
	return amqp.Table{
		ArgDeadLetterExchange:   "",
		ArgDeadLetterRoutingKey: ParkingQueue(name),
		ArgDeadLetterStrategy:   "at-least-once",
		ArgOverflow:             "reject-publish", // required by at-least-once
	}
}

func orQuorum(qt QueueType) QueueType {
	if qt == "" {
		return QueueQuorum
	}
	return qt
}

func (e Exchange) kind() string { return cmp.Or(e.Kind, "topic") }

// args returns the queue's arguments as declared, x-queue-type included.
func (q Queue) args() amqp.Table {
	a := make(amqp.Table, len(q.Args)+1)
	maps.Copy(a, q.Args)
	a[ArgQueueType] = string(orQuorum(q.Type))
	return a
}

// Merge returns t followed by the entries of o that t lacks. Identical
// entries appear once; conflicting ones (one name, two definitions) are
// kept, so Validate and Declare report them.
func (t Topology) Merge(o Topology) Topology {
	return Topology{
		Exchanges: appendNew(slices.Clone(t.Exchanges), o.Exchanges),
		Queues:    appendNew(slices.Clone(t.Queues), o.Queues),
		Bindings:  appendNew(slices.Clone(t.Bindings), o.Bindings),
	}
}

func appendNew[T any](dst, src []T) []T {
	for _, v := range src {
		if !slices.ContainsFunc(dst, func(d T) bool { return reflect.DeepEqual(d, v) }) {
			dst = append(dst, v)
		}
	}
	return dst
}

// Validate reports every problem Declare would run into: empty or reserved
// names, unknown exchange kinds or queue types, a name defined twice
// differently, and bindings to the default exchange.
func (t Topology) Validate() error {
	var errs []error
	exchanges := map[string]Exchange{}
	for _, e := range t.Exchanges {
		switch {
		case e.Name == "" || strings.HasPrefix(e.Name, "amq."):
			errs = append(errs, fmt.Errorf("exchange %q: name is empty or reserved", e.Name))
		case !slices.Contains([]string{"direct", "topic", "fanout", "headers"}, e.kind()):
			errs = append(errs, fmt.Errorf("exchange %q: unknown kind %q", e.Name, e.Kind))
		}
		if prev, ok := exchanges[e.Name]; ok && prev.kind() != e.kind() {
			errs = append(errs, fmt.Errorf("exchange %q defined twice: kinds %q and %q", e.Name, prev.kind(), e.kind()))
		}
		exchanges[e.Name] = e
	}
	queues := map[string]Queue{}
	for _, q := range t.Queues {
		switch {
		case q.Name == "" || strings.HasPrefix(q.Name, "amq."):
			errs = append(errs, fmt.Errorf("queue %q: name is empty or reserved", q.Name))
		case orQuorum(q.Type) != QueueQuorum && q.Type != QueueClassic:
			errs = append(errs, fmt.Errorf("queue %q: unknown type %q", q.Name, q.Type))
		}
		if err := q.args().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("queue %q: arguments: %w", q.Name, err))
		}
		if prev, ok := queues[q.Name]; ok && !reflect.DeepEqual(prev.args(), q.args()) {
			errs = append(errs, fmt.Errorf("queue %q defined twice with different types or arguments", q.Name))
		}
		queues[q.Name] = q
	}
	for _, b := range t.Bindings {
		if b.Exchange == "" || b.Queue == "" {
			errs = append(errs, fmt.Errorf("binding %q -> %q (%q): exchange and queue are required (the default exchange cannot be bound)", b.Exchange, b.Queue, b.RoutingKey))
		}
	}
	return errors.Join(errs...)
}

// Declare declares t on ch: exchanges, then queues, then bindings, all
// durable. Declaring is idempotent; a queue or exchange that exists with
// other arguments makes the broker close ch with PRECONDITION_FAILED, which
// is returned naming the entity. ctx is checked between declarations.
func Declare(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("declare topology: %w", err)
	}
	for _, e := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("declare topology: %w", err)
		}
		if err := ch.ExchangeDeclare(e.Name, e.kind(), true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", e.Name, err)
		}
	}
	for _, q := range t.Queues {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("declare topology: %w", err)
		}
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.args()); err != nil {
			return fmt.Errorf("declare queue %q: %w", q.Name, err)
		}
	}
	for _, b := range t.Bindings {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("declare topology: %w", err)
		}
		if err := ch.QueueBind(b.Queue, b.RoutingKey, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %q to exchange %q with %q: %w", b.Queue, b.Exchange, b.RoutingKey, err)
		}
	}
	return nil
}

// DefinitionsJSON renders t in RabbitMQ's definitions format, for review and
// for import into one vhost (management UI "Import definitions" with a
// vhost selected, or POST /api/definitions/<vhost>). Entries carry no vhost
// field for that reason. Output is deterministic: entries sorted by name
// (bindings by exchange, queue, routing key), duplicates removed, keys
// sorted, indented.
func (t Topology) DefinitionsJSON() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("topology definitions: %w", err)
	}
	type exchange struct {
		Name       string         `json:"name"`
		Type       string         `json:"type"`
		Durable    bool           `json:"durable"`
		AutoDelete bool           `json:"auto_delete"`
		Internal   bool           `json:"internal"`
		Arguments  map[string]any `json:"arguments"`
	}
	type queue struct {
		Name       string         `json:"name"`
		Durable    bool           `json:"durable"`
		AutoDelete bool           `json:"auto_delete"`
		Arguments  map[string]any `json:"arguments"`
	}
	type binding struct {
		Source          string         `json:"source"`
		Destination     string         `json:"destination"`
		DestinationType string         `json:"destination_type"`
		RoutingKey      string         `json:"routing_key"`
		Arguments       map[string]any `json:"arguments"`
	}
	var defs struct {
		Exchanges []exchange `json:"exchanges"`
		Queues    []queue    `json:"queues"`
		Bindings  []binding  `json:"bindings"`
	}
	defs.Exchanges, defs.Queues, defs.Bindings = []exchange{}, []queue{}, []binding{}
	t = Topology{}.Merge(t) // drop duplicates
	for _, e := range t.Exchanges {
		defs.Exchanges = append(defs.Exchanges, exchange{Name: e.Name, Type: e.kind(), Durable: true, Arguments: map[string]any{}})
	}
	for _, q := range t.Queues {
		defs.Queues = append(defs.Queues, queue{Name: q.Name, Durable: true, Arguments: q.args()})
	}
	for _, b := range t.Bindings {
		defs.Bindings = append(defs.Bindings, binding{Source: b.Exchange, Destination: b.Queue, DestinationType: "queue", RoutingKey: b.RoutingKey, Arguments: map[string]any{}})
	}
	slices.SortFunc(defs.Exchanges, func(a, b exchange) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(defs.Queues, func(a, b queue) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(defs.Bindings, func(a, b binding) int {
		return cmp.Or(strings.Compare(a.Source, b.Source), strings.Compare(a.Destination, b.Destination), strings.Compare(a.RoutingKey, b.RoutingKey))
	})
	out, err := json.MarshalIndent(defs, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("topology definitions: %w", err)
	}
	return append(out, '\n'), nil
}

// LegacyWorkQueue recognizes Declare's error for t when the broker refused a
// quorum work queue of t because the queue exists without the dead-letter
// arguments WorkQueue gives it (declared by a version of the runtime that
// did not set them): the PRECONDITION_FAILED names one of them. It returns
// the queue's name and t with that queue declared as it exists, so that
// declaring the result succeeds and the deployment keeps running; the
// queue then has no dead-letter target, and the caller says so. A policy
// gives it one without redeclaring the queue (policies apply to existing
// queues; x-arguments are fixed when a queue is created): see
// LegacyWorkQueuePolicy. ok is false for any other error.
func LegacyWorkQueue(t Topology, err error) (_ Topology, queue string, ok bool) {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return t, "", false
	}
	arg, queue := inequivalentArg(ae.Reason)
	if _, ok := parkingArgs("")[arg]; !ok {
		return t, "", false
	}
	i := slices.IndexFunc(t.Queues, func(q Queue) bool {
		return q.Name == queue && orQuorum(q.Type) == QueueQuorum && reflect.DeepEqual(q.Args, parkingArgs(queue))
	})
	if i < 0 {
		return t, "", false
	}
	t.Queues = slices.Clone(t.Queues)
	t.Queues[i].Args = nil
	return t, queue, true
}

// LegacyWorkQueuePolicy is the policy definition that gives work queue
// queue, declared without dead-lettering, the dead-lettering WorkQueue
// declares (see LegacyWorkQueue), as JSON for rabbitmqctl set_policy or the
// management API.
func LegacyWorkQueuePolicy(queue string) string {
	b, _ := json.Marshal(map[string]string{
		"dead-letter-exchange":    "",
		"dead-letter-routing-key": ParkingQueue(queue),
		"dead-letter-strategy":    "at-least-once",
		"overflow":                "reject-publish",
	})
	return string(b)
}

// inequivalentArg returns the argument and the queue a PRECONDITION_FAILED
// reason of queue.declare names ("inequivalent arg 'x-dead-letter-exchange'
// for queue 'orders' in vhost '/': ..."), or "".
func inequivalentArg(reason string) (arg, queue string) {
	return quoted(reason, "inequivalent arg '"), quoted(reason, "for queue '")
}

// quoted returns the text between prefix and the next single quote in s.
func quoted(s, prefix string) string {
	i := strings.Index(s, prefix)
	if i < 0 {
		return ""
	}
	rest := s[i+len(prefix):]
	if j := strings.IndexByte(rest, '\''); j >= 0 {
		return rest[:j]
	}
	return ""
}

// Plan is the broker entities of one contract package as generated code
// declares them (its TopologyPlan): exchanges, work queue names and
// bindings. [Plan.Topology] adds every work queue's retry tier queues and
// parking lot.
type Plan struct {
	Exchanges  []Exchange
	WorkQueues []string
	Bindings   []Binding
	// Retry holds the retry policies the contract declares, by work queue;
	// a queue without one gets the policy Topology is given.
	Retry map[string]RetryPolicy
}

// RetryPolicy is [retry.Policy], named here so that generated topology
// plans declare their queues' policies without importing runtime/retry.
type RetryPolicy = retry.Policy

// Topology returns the plan's topology with work queues of type qt, each
// with the retry tier queues of its policy ([Plan.RetryFor] with p) and a
// parking lot (see [WorkQueue]). The consumers of these queues must use the
// same policies.
func (pl Plan) Topology(qt QueueType, p retry.Policy) Topology {
	t := Topology{Exchanges: slices.Clone(pl.Exchanges), Bindings: slices.Clone(pl.Bindings)}
	for _, q := range pl.WorkQueues {
		t.Queues = append(t.Queues, WorkQueue(q, qt, pl.RetryFor(q, p))...)
	}
	return t
}

// RetryFor returns the retry policy of work queue q: the one the plan
// declares for it, else p.
func (pl Plan) RetryFor(q string, p retry.Policy) retry.Policy {
	if d, ok := pl.Retry[q]; ok {
		return d
	}
	return p
}

// Default is [Plan.Topology] with quorum queues and retry.Default().
func (pl Plan) Default() Topology { return pl.Topology(QueueQuorum, retry.Default()) }
