package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/internal/retain"
	"github.com/protosaga/saga/runtime/telemetry"
)

// RelayConfig configures a Relay. Pool and Conn are required.
type RelayConfig struct {
	// Pool is the database holding saga_outbox. The relay takes one
	// connection out of it for LISTEN and its liveness lock, so it must
	// reach PostgreSQL directly or through a session-mode pooler.
	Pool *pgxpool.Pool
	// Conn is the broker connection to publish on. Use a connection of its
	// own, not the one consumers use.
	Conn *broker.Conn
	// Owner identifies this relay in the leases it takes
	// (saga_outbox_pending.lease_owner) and the publishes it records
	// (saga_outbox_sent.relay); default "<hostname>-<pid>-<random>". Each
	// running relay needs its own.
	Owner string
	// BatchSize is how many rows one claim takes; default 500. Claims run
	// ahead of publishing by up to two batches, so a batch is claimed
	// while the one before it is being published; bigger batches mean
	// fewer statements per row but more rows leased ahead of the broker.
	BatchSize int
	// Window is the number of publisher confirms outstanding at once,
	// counted across batches: the relay sends the next batch while the
	// confirms of the previous ones are on their way, and waits only when
	// Window messages are unconfirmed. Default 1024, two default batches
	// (docs/benchmarks.md compares batch and window sizes). A lost channel
	// fails up to Window publishes, which are then published again.
	Window int
	// PollInterval is how often the relay looks for rows without a
	// notification; default 1 s.
	PollInterval time.Duration
	// LeaseDuration is how long claimed rows are reserved for this relay;
	// default 30 s. It must cover a batch's whole way through the relay —
	// waiting behind up to two claimed batches and a window of confirms,
	// being published, and being marked: when it runs out first, another
	// relay may publish the same rows again (a duplicate, never a loss). A
	// crashed relay's rows wait this long only when its death cannot be
	// told: other relays release them about four polls after its database
	// session, which holds its liveness lock, has ended (see the package
	// documentation).
	LeaseDuration time.Duration
	// ConfirmTimeout bounds the wait for the oldest outstanding publisher
	// confirm, and the drain after Run's context ends; default
	// LeaseDuration/3. It must be shorter than LeaseDuration.
	ConfirmTimeout time.Duration
	// Logger receives errors and batch summaries; nil uses
	// Telemetry.Logger, then discards them.
	Logger *slog.Logger
	// Telemetry receives the relay's spans (one "send" span per publish,
	// a child of the row's traceparent) and metrics; the zero value
	// disables them.
	Telemetry telemetry.Providers
	// KeepPublished is how long a published row stays in saga_outbox, with
	// its saga_outbox_sent record, before the relay deletes it with
	// [Prune]; default 7 days. Until then the saga's timeline lists the
	// message and [Republish] releases the same row again. A negative
	// value keeps published rows until something else prunes them
	// (sagactl prune). Every running relay prunes, when it starts and then
	// every PruneInterval; their prunes take disjoint rows. Each prune that
	// deleted rows is logged (Info), and each failed one (Warn).
	KeepPublished time.Duration
	// PruneInterval is how often the relay prunes; default 1 minute.
	PruneInterval time.Duration
	// Now is the relay's clock (for deadlines and logs; leases and the
	// pruning cut use the database clock so relays on skewed hosts agree);
	// default time.Now.
	Now func() time.Time

	// afterPublish runs after a batch's confirms were awaited and before
	// its outcome goes to be marked. Tests use it to simulate a crash: a
	// non-nil error makes Run return it at once; nothing more is sent,
	// marked or released, so this batch and every batch claimed after it
	// stay leased and unmarked, as if the process had died.
	afterPublish func(ids []int64) error
	// onListen runs each time the LISTEN connection is (re)established.
	onListen func()
	// beforeLiveness runs before each try for the liveness lock; tests
	// use it to make the listener slow.
	beforeLiveness func()
}

func (c *RelayConfig) setDefaults() {
	if c.Owner == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.Window <= 0 {
		c.Window = 1024
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 30 * time.Second
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = c.LeaseDuration / 3
	}
	if c.KeepPublished == 0 {
		c.KeepPublished = retain.DefaultKeepPublished
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = retain.DefaultInterval
	}
	c.Logger = c.Telemetry.LoggerOr(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *RelayConfig) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if c.Conn == nil {
		errs = append(errs, errors.New("Conn is required"))
	}
	if c.LeaseDuration < time.Millisecond {
		errs = append(errs, fmt.Errorf("LeaseDuration %v is below 1ms", c.LeaseDuration))
	}
	if c.ConfirmTimeout >= c.LeaseDuration {
		errs = append(errs, fmt.Errorf("ConfirmTimeout %v must be shorter than LeaseDuration %v", c.ConfirmTimeout, c.LeaseDuration))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox relay config: %w", err)
	}
	return nil
}

// Relay publishes committed outbox rows. See the package documentation for
// its guarantees.
//
// Run is a pipeline of four goroutines joined by bounded channels, so that
// the database round trips and the broker's confirms of one batch overlap
// the publishing of the next:
//
//   - the claimer leases a batch (one committed statement) and hands it on,
//     claiming again at once after a full batch and otherwise waiting for a
//     notification or the poll; at most two claimed batches wait for the
//     sender, one in the channel and one in the claimer's hand;
//   - the sender publishes each batch in id order without waiting for its
//     confirms ([broker.Publisher.Send]): it blocks only while Window
//     messages, of whichever batches, are unconfirmed;
//   - the awaiter waits for each batch's confirms in turn
//     ([broker.Pending.Wait]) and hands the per-row outcome on;
//   - the settler marks confirmed rows published and releases failed ones,
//     merging every outcome queued while its previous statement ran into
//     one statement.
//
// Each batch carries a context bounded by its lease, so a batch that cannot
// finish within LeaseDuration is abandoned (its rows are claimed again
// later). When Run's context ends the claimer stops, claimed batches not
// yet sent are released unpublished (claimable again at once), hand-offs
// already queued are still sent, and the batches sent are finished:
// confirms awaited, rows marked. The drain is bounded by ConfirmTimeout.
type Relay struct {
	cfg RelayConfig
	pub *broker.Publisher
	tel relayTelemetry

	published, failed, pruned, orphans atomic.Int64

	// Hand-offs (see relayOf): open while Run accepts them, into
	// direct, which only the sender reads.
	mu     sync.RWMutex
	open   bool
	direct chan *batch
	handed atomic.Int64
}

// RelayStats counts what a relay did since it was created.
type RelayStats struct {
	// Published counts rows this relay marked published.
	Published int64
	// Failed counts publishes that were not confirmed (nack, return,
	// timeout, connection loss) and were released for another attempt.
	Failed int64
	// HandedOff counts rows handed to the relay after their commit (see
	// relayOf) rather than claimed. They are published like claimed
	// rows, or released unsent if the relay stops first.
	HandedOff int64
	// Pruned counts published rows the relay deleted (KeepPublished).
	Pruned int64
	// Orphans counts pending rows the relay found without their outbox
	// row and deleted (each is logged with its id).
	Orphans int64
}

// NewRelay validates cfg and returns a relay. Call Run to start it.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newRelayTelemetry(cfg.Telemetry)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	return &Relay{
		cfg:    cfg,
		pub:    broker.NewPublisher(cfg.Conn, broker.PublisherConfig{Window: cfg.Window, ConfirmTimeout: cfg.ConfirmTimeout}),
		tel:    tel,
		direct: make(chan *batch, directDepth),
	}, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Published: r.published.Load(), Failed: r.failed.Load(), HandedOff: r.handed.Load(), Pruned: r.pruned.Load(), Orphans: r.orphans.Load()}
}

// Run relays until ctx is canceled, then drains (see [Relay]) and returns
// nil. Database and broker errors are logged and retried with backoff; Run
// returns an error only for a simulated crash in tests.
func (r *Relay) Run(ctx context.Context) error {
	defer r.pub.Close()
	r.setOpen(true)
	defer r.setOpen(false)
	// The listener, which holds the liveness lock, outlives ctx until the
	// pipeline has finished the rows in flight (see listen).
	listenCtx, stopListen := context.WithCancelCause(context.WithoutCancel(ctx))
	wake := make(chan struct{}, 1)
	listenDone := make(chan struct{})
	tried := make(chan struct{}) // closed once the listener first tried for the lock
	go func() {
		defer close(listenDone)
		r.listen(listenCtx, wake, tried)
	}()
	cause := errors.New("outbox relay crashed")
	defer func() {
		stopListen(cause)
		<-listenDone
	}()
	defer r.retention().Start(ctx)()
	err := r.runPipeline(ctx, wake, tried)
	if err == nil {
		cause = errStopped // nothing of ours is left leased: unregister
	}
	return err
}

// retention deletes published rows older than KeepPublished.
func (r *Relay) retention() retain.Job {
	return retain.Job{
		What: "published outbox rows", Keep: r.cfg.KeepPublished, Interval: r.cfg.PruneInterval,
		Clock: retain.DatabaseClock(r.cfg.Pool),
		Prune: func(ctx context.Context, olderThan time.Time) (int64, error) {
			return Prune(ctx, r.cfg.Pool, olderThan)
		},
		Pruned: func(n int64) { r.pruned.Add(n) },
		Logger: r.cfg.Logger.With("owner", r.cfg.Owner),
	}
}

// runPipeline runs the claimer, sender, awaiter and settler (see [Relay])
// until ctx ends and everything in flight is finished or abandoned.
func (r *Relay) runPipeline(ctx context.Context, wake, lockTried <-chan struct{}) error {
	p := &pipeline{r: r, ctx: ctx, lockTried: lockTried, crashed: make(chan struct{})}
	// stop ends claiming and sending: ctx, or a crash. grace bounds
	// everything already claimed: it outlives ctx by ConfirmTimeout (the
	// drain) and ends at once on a crash.
	p.stop, p.halt = context.WithCancel(ctx)
	defer p.halt()
	p.grace, p.abort = context.WithCancel(context.WithoutCancel(ctx))
	defer p.abort()
	stopDrain := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ConfirmTimeout, p.abort)
		context.AfterFunc(p.grace, func() { t.Stop() })
	})
	defer stopDrain()

	// The batches awaiting their confirms hold at most Window messages:
	// Window/BatchSize of them, one more for the remainder and one so the
	// sender never waits for the awaiter while the window has room. (The
	// sender merges queued hand-offs into batches of up to BatchSize rows,
	// so small hand-offs do not fill these channels with small batches.)
	depth := r.cfg.Window/r.cfg.BatchSize + 2
	claimed := make(chan *batch, 1)
	sent := make(chan *batch, depth)
	outcomes := make(chan *batch, depth)
	var wg sync.WaitGroup
	wg.Go(func() { p.claimer(wake, claimed) })
	wg.Go(func() { p.sender(claimed, sent) })
	wg.Go(func() { p.awaiter(sent, outcomes) })
	p.settler(outcomes)
	wg.Wait()
	return p.crashErr
}
