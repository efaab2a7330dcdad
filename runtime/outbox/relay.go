package outbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/envelope"
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

	// Hand-offs (see WithRelay): open while Run accepts them, into
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
	// WithRelay) rather than claimed. They are published like claimed
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

// pipeline is the state the stages of one Run share.
type pipeline struct {
	r     *Relay
	ctx   context.Context // Run's
	stop  context.Context // ends claiming and sending
	halt  context.CancelFunc
	grace context.Context // parent of every batch's work context
	abort context.CancelFunc

	lockTried <-chan struct{} // closed once the listener first tried for the liveness lock

	crashed  chan struct{} // closed when the afterPublish hook fails
	crashErr error         // set before crashed is closed
}

// crash stops the relay as a dead process would: nothing more is sent,
// marked or released.
func (p *pipeline) crash(err error) {
	p.crashErr = err
	close(p.crashed)
	p.halt()
	p.abort()
}

func (p *pipeline) hasCrashed() bool {
	select {
	case <-p.crashed:
		return true
	default:
		return false
	}
}

type row struct {
	id       int64
	attempts int32
	env      envelope.Envelope
	// pendingSince is when the row became pending again after it was
	// published (an operator's replay: saga_outbox_pending.pending_since);
	// invalid for every other row. The claim compares it with the outbox
	// row's created_at, both the database's clock, and reports it only when
	// later, so the publish delay of other rows uses one clock.
	pendingSince pgtype.Timestamptz
}

// batch is one claim on its way through the pipeline.
type batch struct {
	rows      []row
	claimedAt time.Time // by the relay's clock, for logs
	deadline  time.Time // when the lease runs out: claimed + LeaseDuration, or what a hand-off's insert left
	// work bounds publishing and settling the batch: the lease, and the
	// drain once Run's context ends. finish releases it.
	work   context.Context
	finish context.CancelFunc

	handed  bool // handed over by a consumer's commit (see WithRelay), not claimed
	sent    bool // published (false: released unpublished)
	spans   []trace.Span
	pending *broker.Pending
	errs    []error // per row, once its confirm was awaited
}

// claimer claims batches into out until p.stop ends, then closes out.
func (p *pipeline) claimer(wake <-chan struct{}, out chan<- *batch) {
	defer close(out)
	r := p.r
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	// The first claim waits (a little) for the listener's first try at the
	// liveness lock: rows claimed before the lock is held wait for their
	// lease, not for the other relays' liveness check, if the process dies.
	if p.lockTried != nil {
		select {
		case <-p.lockTried:
		case <-time.After(max(r.cfg.PollInterval, time.Second)):
		case <-p.stop.Done():
			return
		}
	}
	var reaped time.Time
	wasBlocked := false
	for failures := 0; p.stop.Err() == nil; {
		if time.Since(reaped) >= r.cfg.PollInterval {
			// Rows of relays that died wait for no lease (liveness.go).
			reaped = time.Now()
			if err := r.reap(p.stop); err != nil && p.stop.Err() == nil {
				r.cfg.Logger.Warn("outbox relay: could not look for relays that are gone", "owner", r.cfg.Owner, "error", err)
			}
		}
		// While the broker blocks the connection (a resource alarm),
		// nothing can be published: rows stay unclaimed rather than being
		// claimed, failed and released over and over.
		if reason, blocked := r.cfg.Conn.Blocked(); blocked {
			if !wasBlocked {
				r.cfg.Logger.Warn("outbox relay: the broker blocked the connection; claiming nothing until it unblocks",
					"owner", r.cfg.Owner, "reason", reason)
				wasBlocked = true
			}
			select {
			case <-p.stop.Done():
				return
			case <-time.After(r.cfg.PollInterval):
			}
			continue
		}
		if wasBlocked {
			r.cfg.Logger.Info("outbox relay: the broker unblocked the connection", "owner", r.cfg.Owner)
			wasBlocked = false
		}
		// A claim runs under grace, not ctx: once it has started it
		// completes, so a claim committed just as ctx ended is released
		// by the sender rather than left leased.
		rows, err := r.claim(p.grace)
		if err != nil {
			if p.stop.Err() != nil {
				return
			}
			r.cfg.Logger.Error("outbox relay: claim failed", "owner", r.cfg.Owner, "error", err)
			wait := broker.Backoff(failures, 50*time.Millisecond, 5*time.Second)
			failures++
			select {
			case <-p.stop.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		if len(rows) > 0 {
			b := &batch{rows: rows, claimedAt: r.cfg.Now(), deadline: time.Now().Add(r.cfg.LeaseDuration)}
			out <- b // the sender takes everything until out is closed
			if len(rows) >= r.cfg.BatchSize {
				continue // probably more waiting
			}
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-p.stop.Done():
			return
		case <-wake:
		case <-poll.C:
		}
	}
}

// sender publishes each claimed or handed-off batch without waiting for its
// confirms and passes it on. After ctx ends it passes batches on unsent, to
// be released; after a crash it drops them, leased, as a dead process would.
// Once the claimer is done it stops hand-offs and empties their queue the
// same way.
func (p *pipeline) sender(in <-chan *batch, out chan<- *batch) {
	defer close(out)
	r := p.r
	for in != nil {
		select {
		case b, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			p.forward(b, out)
		case b := <-r.direct:
			p.forward(p.merge(b), out)
		}
	}
	r.setOpen(false)
	for {
		select {
		case b := <-r.direct:
			p.forward(p.merge(b), out)
		default:
			return
		}
	}
}

// merge adds the hand-offs queued behind b to it, up to BatchSize rows (or
// b's own size, when that is more), so that under load the hand-offs of
// many consumer commits travel as one batch.
func (p *pipeline) merge(b *batch) *batch {
	for len(b.rows) < p.r.cfg.BatchSize {
		select {
		case more := <-p.r.direct:
			b.rows = append(b.rows, more.rows...)
			if more.deadline.Before(b.deadline) { // the first lease to run out bounds the batch
				b.deadline = more.deadline
			}
		default:
			return b
		}
	}
	return b
}

// forward gives b, claimed or handed off, its work context — bounded by its
// lease and by the drain — and sends it, or passes it on unsent, or drops
// it (after a crash). After ctx ended a claimed batch goes on unsent, to be
// released; a handed-over one, which the relay accepted while it was open,
// is still sent within the drain, so that what a stopping process's
// consumers committed last is published rather than left for a claim.
func (p *pipeline) forward(b *batch, out chan<- *batch) {
	b.work, b.finish = context.WithDeadline(p.grace, b.deadline)
	switch {
	case p.hasCrashed():
		b.finish()
		return
	case p.ctx.Err() == nil, b.handed && b.work.Err() == nil:
		p.send(b)
	}
	out <- b
}

func (p *pipeline) send(b *batch) {
	r := p.r
	msgs := make([]broker.Outgoing, len(b.rows))
	if r.tel.tracer != nil {
		b.spans = make([]trace.Span, len(b.rows))
	}
	for i := range b.rows {
		rw := &b.rows[i]
		if b.spans != nil {
			b.spans[i] = r.tel.startSend(p.ctx, rw, r.cfg.Owner)
		}
		msgs[i] = broker.Outgoing{Exchange: rw.env.Exchange, RoutingKey: rw.env.RoutingKey, Publishing: rw.env.Publishing()}
	}
	b.pending = r.pub.Send(b.work, msgs)
	b.sent = true
}

// awaiter waits for the confirms of each sent batch, in order, and passes
// it on to be settled.
func (p *pipeline) awaiter(in <-chan *batch, out chan<- *batch) {
	defer close(out)
	r := p.r
	for b := range in {
		if p.hasCrashed() {
			b.finish()
			continue
		}
		if b.sent {
			b.errs = b.pending.Wait(b.work)
			if r.tel.metrics.Enabled() || b.spans != nil {
				now := time.Now()
				for i := range b.rows {
					var span trace.Span
					if b.spans != nil {
						span = b.spans[i]
					}
					r.tel.published(p.ctx, span, &b.rows[i], b.errs[i], now)
				}
			}
			if r.cfg.afterPublish != nil {
				ids := make([]int64, len(b.rows))
				for i, rw := range b.rows {
					ids[i] = rw.id
				}
				if err := r.cfg.afterPublish(ids); err != nil {
					p.crash(err)
					b.finish()
					continue
				}
			}
		}
		out <- b
	}
}

// settler records the outcome of each batch, merging the batches that
// queued up while it was busy into one statement.
func (p *pipeline) settler(in <-chan *batch) {
	for b := range in {
		bs := []*batch{b}
	merge:
		for {
			select {
			case more, ok := <-in:
				if !ok {
					break merge
				}
				bs = append(bs, more)
			default:
				break merge
			}
		}
		p.settle(bs)
		for _, b := range bs {
			b.finish()
		}
	}
}

// settleContext bounds one settle: LeaseDuration while the relay runs (its
// retries give up then), ConfirmTimeout more once ctx ends (the drain; this
// also covers batches released unsent after the awaiter spent the drain),
// and nothing after a crash, which marks and releases nothing, as a dead
// process would not.
func (p *pipeline) settleContext() (context.Context, context.CancelFunc) {
	r := p.r
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), r.cfg.LeaseDuration)
	stopDrain := context.AfterFunc(p.ctx, func() {
		t := time.AfterFunc(r.cfg.ConfirmTimeout, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	go func() {
		select {
		case <-p.crashed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		stopDrain()
		cancel()
	}
}

// directDepth is how many hand-offs (one per committed transaction)
// wait for the sender at most; hand-offs beyond it are released to be
// claimed instead.
const directDepth = 256

type relayKey struct{}

// WithRelay returns a context in which [Enqueue], called from a handler the
// runtime runs in this process (a consumer handler, a participant, the saga
// engine inside one) or from saga.Engine.Start, the timeout scanner
// (FireTimeouts, RunTimeouts), saga.Engine.Operate and the admin server's
// repairs, hands its rows to r once that transaction commits, instead of waking relays to claim them. The
// rows are inserted already leased to r (their pending rows have
// lease_owner, lease_until = the transaction's start + LeaseDuration,
// attempts 1), so no relay claims them
// meanwhile and r publishes them
// without a claim statement: the claim and its row update are skipped, and
// so is the notification round trip. The guarantees do not change:
//
//   - r gets the rows only after the transaction committed, and only those
//     of handlers whose writes committed (a failed handler's savepoint, a
//     rolled-back transaction hand over nothing);
//   - when r is not running, or is stopping, Enqueue writes the rows
//     unleased as usual; when r stops or its queue is full by the time the
//     commit is done, the rows are released (lease cleared, relays woken)
//     for any relay to claim;
//   - when the process dies between commit and publish, the rows are
//     published by any relay once it finds r gone (a few polls after its
//     database session ends, see the package documentation) or at the
//     latest when their lease runs out, as for a relay that died holding a
//     claim.
//
// Enqueue in a transaction of the caller's own is not affected, nor is
// Enqueue on a savepoint a handler opened (its rows are claimed as usual).
// On a consumer's fast path the rows of the whole batch are inserted
// together with the relay the consumer's context carries: give the relay
// to the consumer (Run's context), not to one handler's context.
// A handler must not use the transaction it was given while a savepoint of
// its own is open and then roll that savepoint back: rows written and then
// undone that way could be handed over.
func WithRelay(ctx context.Context, r *Relay) context.Context {
	return context.WithValue(ctx, relayKey{}, r)
}

func relayFrom(ctx context.Context) *Relay {
	r, _ := ctx.Value(relayKey{}).(*Relay)
	return r
}

func (r *Relay) setOpen(open bool) {
	r.mu.Lock()
	r.open = open
	r.mu.Unlock()
}

func (r *Relay) accepting() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.open
}

// leasedRows is what one Enqueue wrote leased to a relay.
type leasedRows struct {
	rows     []row
	deadline time.Time // when their lease runs out, by the local clock
}

// scan reads the ids and remaining lease insertLeasedSQL returns.
func (lr *leasedRows) scan(rows pgx.Rows) error {
	byID := make(map[string]int64, len(lr.rows))
	var (
		id, leftMS int64
		mid        string
	)
	now := time.Now()
	_, err := pgx.ForEachRow(rows, []any{&id, &mid, &leftMS}, func() error {
		byID[mid] = id
		if d := now.Add(time.Duration(leftMS) * time.Millisecond); lr.deadline.IsZero() || d.Before(lr.deadline) {
			lr.deadline = d
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range lr.rows {
		var ok bool
		if lr.rows[i].id, ok = byID[lr.rows[i].env.MessageID]; !ok {
			return fmt.Errorf("outbox insert returned no id for message %s", lr.rows[i].env.MessageID)
		}
	}
	return nil
}

// handoff collects the leased rows of one transaction's kept handlers and
// hands them to the relay once, after the commit (a txq.Collector).
type handoff struct {
	r        *Relay
	rows     []row
	deadline time.Time
}

func (h *handoff) add(lr *leasedRows) {
	h.rows = append(h.rows, lr.rows...)
	if h.deadline.IsZero() || lr.deadline.Before(h.deadline) {
		h.deadline = lr.deadline
	}
}

// Flush hands the collected rows over.
func (h *handoff) Flush(ctx context.Context) {
	if len(h.rows) > 0 {
		h.r.handoff(ctx, h)
	}
}

// handoff queues committed rows for the sender. When the relay is not
// accepting or its queue is full, it releases them for a claim instead.
func (r *Relay) handoff(ctx context.Context, h *handoff) {
	r.mu.RLock()
	queued := false
	if r.open {
		select {
		case r.direct <- &batch{rows: h.rows, claimedAt: r.cfg.Now(), deadline: h.deadline, handed: true}:
			queued = true
		default:
		}
	}
	r.mu.RUnlock()
	if queued {
		r.handed.Add(int64(len(h.rows)))
		return
	}
	ids := make([]int64, len(h.rows))
	for i, rw := range h.rows {
		ids[i] = rw.id
	}
	// Typically at shutdown, when the consumer's context may be ending
	// too: the release still runs, briefly.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ConfirmTimeout)
	defer cancel()
	if _, err := r.cfg.Pool.Exec(ctx, releaseHandoffSQL, ids, r.cfg.Owner); err != nil {
		r.cfg.Logger.Warn("outbox relay: could not take committed rows nor release them; they are published when their lease runs out",
			"owner", r.cfg.Owner, "rows", len(ids), "first_message_id", h.rows[0].env.MessageID,
			"lease", r.cfg.LeaseDuration, "error", err)
	}
}

// releaseHandoffSQL frees rows born leased to a relay that could not take
// them, and wakes relays to claim them.
const releaseHandoffSQL = `
WITH released AS (
  UPDATE saga_outbox_pending SET lease_owner = NULL, lease_until = NULL
  WHERE id = ANY($1::bigint[]) AND lease_owner = $2 AND attempts = 1
  RETURNING id
)
SELECT pg_notify('` + NotifyChannel + `', '') WHERE EXISTS (SELECT FROM released)`

func (p *pipeline) settle(bs []*batch) {
	r := p.r
	var s settlement
	for _, b := range bs {
		for i, rw := range b.rows {
			switch {
			case !b.sent: // free it for anyone at once
				s.release(rw, 0)
				s.unsent++
			case b.errs[i] == nil:
				s.done = append(s.done, rw.id)
				s.doneAttempts = append(s.doneAttempts, rw.attempts)
			default:
				s.release(rw, retryDelay(b.errs[i], rw.attempts))
				r.cfg.Logger.Warn("outbox relay: publish failed; will retry",
					"owner", r.cfg.Owner, "message_id", rw.env.MessageID, "message_type", rw.env.MessageType,
					"saga_id", rw.env.SagaID, "correlation_id", rw.env.CorrelationID, "causation_id", rw.env.CausationID,
					"exchange", rw.env.Exchange, "routing_key", rw.env.RoutingKey, "attempts", rw.attempts, "error", b.errs[i])
			}
		}
	}
	// Marking confirmed rows needs no lease, so the settle is not bound to
	// the batches' leases (the oldest may be nearly out while younger ones
	// merged with it are fresh): it gets its own context.
	oldest := bs[0]
	ctx, cancel := p.settleContext()
	defer cancel()
	if err := r.settle(ctx, r.cfg.Now(), s); err != nil {
		r.cfg.Logger.Error("outbox relay: settle failed", "owner", r.cfg.Owner, "error", err)
		return
	}
	r.cfg.Logger.Debug("outbox relay: batches done", "owner", r.cfg.Owner, "batches", len(bs),
		"published", len(s.done), "failed", len(s.failed)-s.unsent, "released_unsent", s.unsent,
		"took", r.cfg.Now().Sub(oldest.claimedAt))
}

// settlement is what one settle statement records.
type settlement struct {
	done           []int64
	doneAttempts   []int32 // the attempts of the claim each done row was published under
	failed, delays []int64 // released rows, with their backoff in ms
	attempts       []int32 // and the attempts of the claim they were published under
	unsent         int     // released rows that were never published
}

// latestClaims keeps one entry per row id: that of its latest claim, the
// one with the most attempts, with its delay when delays is not nil. A row
// is listed twice only when it was claimed again after its lease ran out
// while the older claim's settle still waited; the settle statements read
// the first entry of an id, and no claim but the latest can match the row. The
// slices are returned as they are when no id repeats.
func latestClaims(ids []int64, attempts []int32, delays []int64) ([]int64, []int32, []int64) {
	if len(ids) < 2 {
		return ids, attempts, delays
	}
	at := make(map[int64]int, len(ids)) // id -> index of its entry in the result
	for i, id := range ids {
		if _, seen := at[id]; seen {
			break
		}
		at[id] = i
		if i == len(ids)-1 {
			return ids, attempts, delays
		}
	}
	clear(at)
	var keptIDs []int64
	var keptAttempts []int32
	var keptDelays []int64
	for i, id := range ids {
		j, seen := at[id]
		if !seen {
			at[id] = len(keptIDs)
			keptIDs = append(keptIDs, id)
			keptAttempts = append(keptAttempts, attempts[i])
			if delays != nil {
				keptDelays = append(keptDelays, delays[i])
			}
			continue
		}
		if attempts[i] > keptAttempts[j] {
			keptAttempts[j] = attempts[i]
			if delays != nil {
				keptDelays[j] = delays[i]
			}
		}
	}
	return keptIDs, keptAttempts, keptDelays
}

func (s *settlement) release(rw row, delay time.Duration) {
	s.failed = append(s.failed, rw.id)
	s.delays = append(s.delays, delay.Milliseconds())
	s.attempts = append(s.attempts, rw.attempts)
}

// retryDelay is how long a row whose publish failed waits before it can be
// claimed again. Nacks, returns, missing exchanges and messages AMQP cannot
// carry (a broker that refuses, a missing binding or exchange, a row written
// around Enqueue's checks) back off exponentially with the row's attempts,
// so a row that cannot be published does not spin. Connection-level
// failures of a row that was written retry at once the first two times
// (the Conn's reconnect paces those), then back off too: a row whose
// publish makes the broker close the channel (a body over its
// max_message_size) fails every message in flight with it, and must not
// come back at once to do it again. A row never written (ErrNotSent: no
// connection, a blocked one, a failure before it in its batch) retries at
// once, however often it was claimed.
func retryDelay(err error, attempts int32) time.Duration {
	const minDelay, maxDelay = 100 * time.Millisecond, 30 * time.Second
	if errors.Is(err, broker.ErrNacked) || errors.Is(err, broker.ErrReturned) || errors.Is(err, broker.ErrNoExchange) ||
		errors.Is(err, broker.ErrInvalidMessage) {
		return broker.Backoff(int(attempts)-1, minDelay, maxDelay)
	}
	if attempts < 3 || errors.Is(err, broker.ErrNotSent) {
		return 0 // a row never written cannot be what closed the channel
	}
	return broker.Backoff(int(attempts)-3, minDelay, maxDelay)
}

const claimSQL = `
WITH claimed AS (
  UPDATE saga_outbox_pending
  SET lease_owner = $1, lease_until = now() + $2 * interval '1 millisecond', attempts = attempts + 1
  WHERE id = ANY(ARRAY(
    SELECT id FROM saga_outbox_pending
    WHERE lease_until IS NULL OR lease_until < now()
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
  ))
  RETURNING id, attempts, pending_since
)
SELECT c.id, c.attempts, CASE WHEN c.pending_since > o.created_at THEN c.pending_since END, o.id IS NULL,
  coalesce(o.message_id, ''), coalesce(o.exchange, ''), coalesce(o.routing_key, ''), coalesce(o.message_type, ''),
  coalesce(o.schema_version, 0), coalesce(o.correlation_id, ''), coalesce(o.causation_id, ''),
  coalesce(o.saga_id, ''), coalesce(o.saga_type, ''), coalesce(o.idempotency_key, ''),
  coalesce(o.traceparent, ''), coalesce(o.tracestate, ''), o.headers, o.body, coalesce(o.occurred_at, 'epoch')
FROM claimed c LEFT JOIN LATERAL (SELECT * FROM saga_outbox WHERE id = c.id OFFSET 0) o ON true`

// dropOrphansSQL deletes pending rows whose outbox row is gone (deleted by
// hand: nothing the runtime does deletes an outbox row that is still
// pending), while they are still under the claim that found them.
const dropOrphansSQL = `
DELETE FROM saga_outbox_pending p
USING unnest($1::bigint[], $2::int4[]) AS d(id, attempts)
WHERE p.id = d.id AND p.attempts = d.attempts AND p.lease_owner = $3
  AND NOT EXISTS (SELECT FROM saga_outbox o WHERE o.id = p.id)
RETURNING p.id`

// claim leases up to BatchSize publishable rows to this relay, in one
// committed statement, and reads their messages from saga_outbox. The ids
// are collected into an array first so that the rows are then found through
// the primary key: written as id IN (subquery), the planner may hash-join
// the subquery against a sequential scan of the whole table. The array
// keeps the pending rows' update on the primary key. The
// join to saga_outbox after it looks each row up by id: OFFSET 0 keeps the
// lateral subquery from being flattened into a plain join, which a generic
// plan built while saga_outbox was new (never analyzed: 10 pages assumed)
// made a hash join over a sequential scan of the whole outbox, kept as the
// outbox grew (see TestClaimPlanOnANewTable).
//
// A claimed pending row whose outbox row is gone has nothing to publish;
// claim deletes it (see dropOrphans) instead of leasing it again every
// LeaseDuration for ever.
func (r *Relay) claim(ctx context.Context) ([]row, error) {
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.cfg.Owner, r.cfg.LeaseDuration.Milliseconds(), r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	var (
		out     []row
		rw      row
		orphan  bool
		orphans []row
		headers []byte
	)
	e := &rw.env
	_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.attempts, &rw.pendingSince, &orphan, &e.MessageID, &e.Exchange, &e.RoutingKey, &e.MessageType,
		&e.SchemaVersion, &e.CorrelationID, &e.CausationID, &e.SagaID, &e.SagaType, &e.IdempotencyKey,
		&e.Traceparent, &e.Tracestate, &headers, &e.Body, &e.OccurredAt}, func() error {
		if orphan {
			orphans = append(orphans, row{id: rw.id, attempts: rw.attempts})
			return nil
		}
		e.Headers = r.decodeHeaders(rw.id, e.MessageID, headers)
		e.OccurredAt = e.OccurredAt.UTC()
		out = append(out, rw)
		return nil
	})
	if err != nil {
		// The lease runs out by itself; nothing to undo.
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	if len(orphans) > 0 {
		r.dropOrphans(ctx, orphans)
	}
	slices.SortFunc(out, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// dropOrphans deletes claimed pending rows that have no outbox row, and
// says which. Failing, it only logs: the rows stay leased and are found
// again when the lease runs out.
func (r *Relay) dropOrphans(ctx context.Context, orphans []row) {
	ids := make([]int64, len(orphans))
	attempts := make([]int32, len(orphans))
	for i, o := range orphans {
		ids[i], attempts[i] = o.id, o.attempts
	}
	rows, err := r.cfg.Pool.Query(ctx, dropOrphansSQL, ids, attempts, r.cfg.Owner)
	var dropped []int64
	if err == nil {
		dropped, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		r.cfg.Logger.Warn("outbox relay: could not delete pending rows whose outbox row is gone; they are claimed again when their lease runs out",
			"owner", r.cfg.Owner, "outbox_ids", ids, "error", err)
		return
	}
	r.orphans.Add(int64(len(dropped)))
	r.cfg.Logger.Error("outbox relay: pending rows had no outbox row (deleted from saga_outbox by hand?); nothing to publish, their pending rows are deleted",
		"owner", r.cfg.Owner, "outbox_ids", dropped)
}

// decodeHeaders reads a row's headers column as the relay publishes it.
func (r *Relay) decodeHeaders(id int64, messageID string, headers []byte) map[string]any {
	if len(headers) == 0 || bytes.Equal(headers, []byte("{}")) {
		return nil
	}
	var h map[string]any
	dec := json.NewDecoder(bytes.NewReader(headers))
	dec.UseNumber() // keep integers integers
	if err := dec.Decode(&h); err != nil {
		// Enqueue writes only JSON objects; a row written by other means
		// is published without its extra headers rather than blocking
		// every row behind it.
		r.cfg.Logger.Error("outbox relay: headers are not a JSON object; publishing without them",
			"outbox_id", id, "message_id", messageID, "error", err)
		return nil
	}
	return h
}

// settleDoneCTEs finds its rows by id = ANY(ids) and checks each row's claim
// by the attempts at its id's position in the parallel array, instead of
// joining the table with unnest(ids, attempts). The relay prepares it in its
// first seconds, when saga_outbox_pending may be new, never analyzed or
// just emptied, and a prepared statement keeps the generic plan it settles
// on then: for the join that plan was a sequential scan of the pending
// table hashed against the batch, kept while the table grew (every message
// inserts and deletes a pending row, so the table fills with dead rows).
// id = ANY(...) is an index condition whatever the statistics, and
// array_position costs less than the join even for 500 rows
// (docs/benchmarks.md). Each id is listed once (see latestClaims).
const settleDoneCTEs = `
WITH done AS (
  DELETE FROM saga_outbox_pending p
  WHERE p.id = ANY($1::bigint[]) AND p.attempts = ($2::int4[])[array_position($1::bigint[], p.id)]
    AND (p.lease_owner = $3 OR p.lease_owner IS NULL)
  RETURNING p.id, p.attempts
), sent AS (
  INSERT INTO saga_outbox_sent (id, published_at, attempts, relay)
  SELECT id, now(), attempts, $3 FROM done
  ON CONFLICT (id) DO NOTHING
)`

// settleDoneSQL settles confirmed rows only, the usual case. Given an empty
// array of released rows, settleSQL's custom plans drop the released part
// (a constant false), look cheaper than its generic plan, and PostgreSQL
// goes on planning it anew at most executions; this statement keeps its
// generic plan.
const settleDoneSQL = settleDoneCTEs + `
SELECT (SELECT count(*) FROM done), 0::bigint`

// settleSQL settles confirmed rows ($1–$3) and releases failed ones, each
// with its backoff in ms ($4–$6).
const settleSQL = settleDoneCTEs + `, released AS (
  UPDATE saga_outbox_pending p SET lease_owner = NULL,
    lease_until = now() + ($5::bigint[])[array_position($4::bigint[], p.id)] * interval '1 millisecond'
  WHERE p.id = ANY($4::bigint[]) AND p.lease_owner = $3 AND p.attempts = ($6::int4[])[array_position($4::bigint[], p.id)]
  RETURNING p.id
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM released)`

// settle records done rows as published and releases failed rows, in one
// statement (one commit for however many batches s covers): a published
// row's pending row is deleted and a saga_outbox_sent row says when, by
// which relay and after how many leases. Both happen only while the claim
// a row was published under is still the row's latest (same attempts) and
// ours. A late settle, after our lease ran out, therefore neither frees
// nor records a row that was claimed again since (its new claim settles
// it), nor one an operator's Republish made pending again after another
// relay recorded it: Republish carries over the attempts of the claim that
// was recorded, so the replayed row never matches an older claim, and the
// replay is published; and a replay of a row still pending counts one claim
// more, so no claim from before it matches either. A confirmed row whose lease was cleared but not
// claimed again (other relays took this one for dead and released its
// rows) is still recorded: its attempts are still our claim's, and no
// other claim can have published it yet. A failed row is released only
// while the lease is still ours. Database errors
// are retried for up to LeaseDuration from start (and while ctx lasts):
// giving up early only causes duplicates.
func (r *Relay) settle(ctx context.Context, start time.Time, s settlement) error {
	done, doneAttempts, failed, delays, attempts := s.done, s.doneAttempts, s.failed, s.delays, s.attempts
	done, doneAttempts, _ = latestClaims(done, doneAttempts, nil)
	failed, attempts, delays = latestClaims(failed, attempts, delays)
	if done == nil {
		done, doneAttempts = []int64{}, []int32{}
	}
	deadline := start.Add(r.cfg.LeaseDuration)
	for attempt := 0; ; attempt++ {
		var marked, released int64
		var err error
		if len(failed) == 0 {
			err = r.cfg.Pool.QueryRow(ctx, settleDoneSQL, done, doneAttempts, r.cfg.Owner).Scan(&marked, &released)
		} else {
			err = r.cfg.Pool.QueryRow(ctx, settleSQL, done, doneAttempts, r.cfg.Owner, failed, delays, attempts).Scan(&marked, &released)
		}
		if err == nil {
			r.published.Add(marked)
			r.failed.Add(int64(len(s.failed) - s.unsent))
			if lost := int64(len(done)) - marked; lost > 0 {
				r.cfg.Logger.Warn("outbox relay: confirmed rows were claimed again since this relay's claim (its lease ran out, or it was taken for dead); the newer claim, or an operator's replay, publishes them again",
					"owner", r.cfg.Owner, "rows", lost, "confirmed", len(done), "lease", r.cfg.LeaseDuration)
			}
			return nil
		}
		wait := broker.Backoff(attempt, 20*time.Millisecond, time.Second)
		if r.cfg.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("mark %d outbox rows published and release %d (they will be published again): %w", len(done), len(failed), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
