package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/internal/retain"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/telemetry"
)

// Delivery is one decoded message handed to a [BatchHandler] or a
// [HandlerFunc].
type Delivery struct {
	// Envelope is the message's metadata and raw body.
	Envelope message.Envelope
	// Message is the body decoded through the registry.
	Message message.Message
	// Queue is the work queue the message was consumed from.
	Queue string
	// Attempt is the delivery attempt through the retry tiers, 1 for the
	// first. A broker redelivery (after a lost ack) does not count.
	Attempt int
	// ReceivedAt is when the consumer took the delivery from the broker
	// (with a monotonic clock reading), for handlers that time their work.
	ReceivedAt time.Time
	// Unclaimed names the consumer (Config.Name) when it claimed nothing
	// in the inbox for this delivery (Config.HandlerDedupes): a handler
	// that answers it without writing its deduplicating row claims it
	// there itself (inbox.Claim) to drop a redelivery. Empty otherwise.
	Unclaimed string

	ctx context.Context // the context it is handled in (see Context); nil = the batch's
}

// HandlerFunc handles one delivery inside tx. Everything it does to the
// database must go through tx: it commits together with the inbox claim, and
// the message is acknowledged only after that commit. With batching, tx is a
// savepoint inside a transaction shared with other deliveries; the handler
// must neither commit nor roll it back (a handler that does is parked as
// permanent), and must not ignore a failed statement (the transaction is
// then unusable: the delivery fails as unclassified).
//
// A nil error commits the handler's effects. An error rolls them back and is
// routed by its class (see runtime/retry): permanent errors park the
// message, transient and unclassified ones retry it through the tiers until
// the policy's budget is spent, then park it. A panic counts as an
// unclassified error.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d *Delivery) error

// Config configures a [Consumer].
type Config struct {
	// Name identifies the consumer in the inbox. It must be stable across
	// restarts and deploys: renaming it forgets which messages were handled.
	Name string
	// HandlerDedupes says the handler drops a redelivered message itself:
	// every delivery it succeeds on commits a row that names the message
	// id, and a redelivery of that id finds the row and has no effect (a
	// host's participant does: participant.Idempotent's once record).
	// The consumer then claims nothing in the inbox (saga_inbox) for this
	// queue, saving a row per delivery, and names itself in each
	// Delivery.Unclaimed. A handler may also drop a redelivery by a row of
	// its own for some deliveries and claim the others in the inbox itself
	// (a host's saga engine: what it applies as new is recorded in the saga
	// instance, anything else is claimed). Leave it false for any handler
	// that can succeed without either.
	HandlerDedupes bool
	// PruneDedupes, set with HandlerDedupes, deletes the handler's own
	// dedupe rows older than the time given and returns how many it
	// deleted (a host's participant: participant.PruneOnce). The consumer
	// runs it with its inbox prune, under KeepClaims and PruneInterval.
	PruneDedupes func(ctx context.Context, olderThan time.Time) (int64, error)
	// Queue is the work queue to consume. Its tier queues and parking lot
	// (broker.WorkQueue with the same Retry policy) must be declared.
	Queue string
	// Pool is the database the handlers work in.
	Pool *pgxpool.Pool
	// Conn is the consuming connection. Give the consumer a connection of
	// its own, not the one the outbox relay publishes on: a broker that
	// blocks a publishing connection under a resource alarm also stalls
	// the acknowledgements sent on it.
	Conn *broker.Conn
	// PublishConn carries the consumer's own publishes (retry copies and
	// parked messages). Defaults to Conn. Setting it to the application's
	// publishing connection keeps acks flowing while publishing is blocked.
	PublishConn *broker.Conn
	// Registry decodes bodies by message type.
	Registry *message.Registry
	// Batch handles the deliveries of each batch (see [BatchHandler]).
	// Set Batch or Handler, not both.
	Batch BatchHandler
	// Handler handles each delivery: the consumer runs it as the
	// BatchHandler [HandlerFunc.HandleBatch].
	Handler HandlerFunc
	// Relay, when set, is a relay of this process that the outbox rows a
	// batch commits are handed to after the commit, born leased to it,
	// instead of waking relays to claim them (see runtime/outbox).
	Relay *outbox.Relay
	// Prefetch is the channel's QoS prefetch count: how many unacknowledged
	// deliveries the broker sends ahead. Defaults to 2×Concurrency×BatchSize.
	Prefetch int
	// Concurrency is the number of workers, each running its own
	// transaction. Defaults to 4.
	Concurrency int
	// BatchSize is the most deliveries one worker applies in one
	// transaction (one commit, one fsync, one inbox claim). Only deliveries
	// that are already waiting are batched, so a quiet consumer never waits
	// to fill a batch; under load, batches grow and commits are shared.
	// Defaults to 64 (docs/benchmarks.md measures it against smaller
	// batches); 1 disables batching.
	BatchSize int
	// Retry is the retry policy. It must match the tier queues declared for
	// Queue. Defaults to retry.Default().
	Retry retry.Policy
	// MaxRedeliveries guards against a message whose handling stops the
	// process (a crash, a hang until a restart): such a message comes back
	// unacknowledged again and again, and quorum queues count that in its
	// x-delivery-count header. A delivery counted MaxRedeliveries times or
	// more is applied alone, with a row in saga_consumer_suspect committed
	// before its handler runs and removed with the handler's transaction;
	// if the row is still there when the message comes back, handling it
	// stopped the consumer, and it is parked (with its saga and the count)
	// instead of being run again. A handling that ended with an error the
	// consumer saw while nothing cancelled it (the database went away
	// mid-transaction) did not stop it: its row is deleted at once if the
	// database answers within two seconds, before the message goes back to
	// the queue (and to any process), else when this consumer's next
	// session starts, and this process does not park the message for it
	// meanwhile. That is done twice per message and process: a failure the
	// message's own content causes every time (a database error at commit
	// such as running out of lock memory) ends in the parking lot. A
	// handling cancelled because it hung past the drain did stop the
	// consumer. Messages that were only prefetched
	// alongside it are handled normally. Defaults to 10; -1 turns the guard
	// off. Classic queues do not count deliveries: there the consumer counts
	// the redeliveries it sees of each message itself, in memory, so the
	// guard bounds a message whose handling ends the session while the
	// process lives (a database error every time), but not one that kills
	// the process, which forgets its counts.
	MaxRedeliveries int
	// KeepClaims is how long the consumer keeps its inbox claims (the
	// saga_inbox rows that say it handled a message) before it deletes
	// them with inbox.PruneConsumer; default 30 days. A message that comes
	// again after its claim is gone is handled again, so keep claims far
	// longer than any redelivery, relay republish or replay you expect. A
	// negative value keeps them until something else prunes them (sagactl
	// prune). Only this consumer's claims (by Name) are pruned, when Run
	// starts and then every PruneInterval, against the database's clock;
	// each prune that deleted claims is logged (Info), each failed one
	// (Warn).
	KeepClaims time.Duration
	// PruneInterval is how often the consumer prunes; default 1 minute.
	PruneInterval time.Duration
	// DrainTimeout bounds how long a graceful shutdown waits for in-flight
	// deliveries; after it their contexts are cancelled and they are left
	// unacknowledged for redelivery. Closing the channel afterwards waits
	// for the broker at most as long again (then the close goes on in the
	// background, and the channel's prefetched deliveries return to the
	// queue once the broker answers or the connection ends), so Run
	// returns within about twice DrainTimeout of its context's end even
	// when the broker has stopped answering (a resource alarm, a
	// half-dead connection), once handlers return on their cancelled
	// contexts. A handler that does not return within DrainTimeout of its
	// cancel is not waited for: the consumer stops without it, logs its
	// message ids (error level), and leaves its deliveries unacknowledged
	// for redelivery (the inbox drops a redelivery if its transaction
	// commits after all). It still holds its database connection, which
	// pgxpool.Pool.Close waits for. Defaults to 30s.
	DrainTimeout time.Duration
	// Logger receives the consumer's logs. Defaults to Telemetry.Logger,
	// then slog.Default().
	Logger *slog.Logger
	// Telemetry receives a "process QUEUE" consumer span per delivery (a
	// child of the trace context the message carries; the handler's context
	// holds it) and the consumer's metrics. The zero value disables them.
	Telemetry telemetry.Providers
}

// Defaults.
const (
	defaultConcurrency  = 4
	defaultBatchSize    = 64
	defaultDrainTimeout = 30 * time.Second
	defaultRedeliveries = 10
	maxPrefetch         = 65535 // AMQP's prefetch-count is a short
)

// setDefaults fills the zero fields of c with their defaults.
func (c *Config) setDefaults() {
	if c.PublishConn == nil {
		c.PublishConn = c.Conn
	}
	if c.Concurrency == 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.BatchSize == 0 {
		c.BatchSize = defaultBatchSize
	}
	if c.Prefetch == 0 {
		c.Prefetch = min(2*c.Concurrency*c.BatchSize, maxPrefetch)
	}
	if c.MaxRedeliveries == 0 {
		c.MaxRedeliveries = defaultRedeliveries
	}
	if c.Retry.IsZero() {
		c.Retry = retry.Default()
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = defaultDrainTimeout
	}
	if c.KeepClaims == 0 {
		c.KeepClaims = retain.DefaultKeepClaims
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = retain.DefaultInterval
	}
	c.Logger = c.Telemetry.LoggerOr(c.Logger, slog.Default())
}

// Validate reports every problem with c (after defaults are applied).
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Name == "" {
		bad("Name is empty")
	}
	if c.Queue == "" {
		bad("Queue is empty")
	}
	if c.Pool == nil {
		bad("Pool is nil")
	}
	if c.Conn == nil {
		bad("Conn is nil")
	}
	if c.Registry == nil {
		bad("Registry is nil")
	}
	switch {
	case c.Handler == nil && c.Batch == nil:
		bad("Handler is nil, and so is Batch: set one")
	case c.Handler != nil && c.Batch != nil:
		bad("Handler and Batch are both set: set one")
	}
	if c.PruneDedupes != nil && !c.HandlerDedupes {
		bad("PruneDedupes is set without HandlerDedupes: a handler that does not dedupe has no dedupe rows to prune")
	}
	if c.Concurrency < 1 {
		bad("Concurrency is %d, want at least 1", c.Concurrency)
	}
	if c.BatchSize < 1 {
		bad("BatchSize is %d, want at least 1", c.BatchSize)
	}
	if c.Prefetch < 1 || c.Prefetch > maxPrefetch {
		bad("Prefetch is %d, want 1..%d", c.Prefetch, maxPrefetch)
	}
	if c.DrainTimeout < 0 {
		bad("DrainTimeout is %v, want a positive duration", c.DrainTimeout)
	}
	if c.MaxRedeliveries < -1 {
		bad("MaxRedeliveries is %d, want -1 (no limit) or more", c.MaxRedeliveries)
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer %q config: %w", c.Name, err)
	}
	return nil
}
