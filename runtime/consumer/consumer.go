package consumer

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/retain"
)

// Backoff bounds between sessions that ended in a failure.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// publishTimeout bounds the confirmed publish of one batch's retry copies
// and parked messages.
const publishTimeout = 30 * time.Second

// Consumer consumes one work queue. Create it with [New]; run it with
// [Consumer.Run].
type Consumer struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	pub *broker.Publisher // retry copies and parked messages
	tel consumerTelemetry

	// afterCommit, when set (by tests), runs after a batch's transaction
	// committed and before anything is acknowledged or routed. A non-nil
	// error simulates a crash at that point: nothing of the batch is
	// acknowledged, the session's channels are closed at once, and Run
	// returns the error.
	afterCommit func(messageIDs []string) error
	// beforeCommit, when set (by tests), runs once a batch's writes are
	// all sent, just before its COMMIT.
	beforeCommit func()
	// onSettle, when set (by tests), is told about every delivery after it
	// was acknowledged, with its outcome's name.
	onSettle func(messageID, outcome string)
	// current is the running session, for tests.
	current atomic.Pointer[session]
	// fast and fallBack count transactions committed on the fast path and
	// fast-path attempts that fell back to a savepoint per delivery (tests).
	fast, fallBack atomic.Int64
	// pruned counts the inbox claims the consumer deleted (KeepClaims).
	pruned atomic.Int64
	// interrupted: see interruptedSet.
	interrupted interruptedSet
	// redelivered: see redeliveryCounter.
	redelivered redeliveryCounter
}

// New validates cfg (after filling in defaults) and returns a consumer.
func New(cfg Config) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tel, err := newConsumerTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer %q: %w", cfg.Name, err)
	}
	return &Consumer{
		cfg: cfg,
		log: cfg.Logger.With(slog.String("consumer", cfg.Name), slog.String("queue", cfg.Queue)),
		now: time.Now,
		pub: broker.NewPublisher(cfg.PublishConn, broker.PublisherConfig{}),
		tel: tel,
	}, nil
}

// retention deletes the consumer's inbox claims older than KeepClaims.
func (c *Consumer) retention() retain.Job {
	return retain.Job{
		What: "inbox claims", Keep: c.cfg.KeepClaims, Interval: c.cfg.PruneInterval,
		Clock: retain.DatabaseClock(c.cfg.Pool),
		Prune: func(ctx context.Context, olderThan time.Time) (int64, error) {
			return inbox.PruneConsumer(ctx, c.cfg.Pool, c.cfg.Name, olderThan)
		},
		Pruned: func(n int64) { c.pruned.Add(n) },
		Logger: c.log,
	}
}

// crashError is returned by Run when the afterCommit test hook simulated a
// crash.
type crashError struct{ err error }

func (e *crashError) Error() string { return "consumer crashed: " + e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// topologyError reports a queue the consumer needs that does not exist, or
// a tier queue declared with other arguments than broker.WorkQueue gives it
// (mismatch: the broker's answer).
type topologyError struct {
	queue    string
	mismatch error
}

func (e *topologyError) Error() string {
	if e.mismatch != nil {
		return fmt.Sprintf("queue %q exists with other arguments than broker.WorkQueue declares for the consumer's queue and retry policy "+
			"(a retry tier must dead-letter its messages back to the work queue after its delay, or they are lost): %v", e.queue, e.mismatch)
	}
	return fmt.Sprintf("queue %q does not exist: declare broker.WorkQueue for the consumer's queue with the consumer's retry policy", e.queue)
}

// Run consumes until ctx is cancelled, then stops consuming, drains the
// deliveries in flight (up to DrainTimeout), closes its channels and returns
// nil. Lost channels, connections and database outages do not end Run: it
// backs off and starts a new session. Run returns an error only when the
// queues it needs are not declared when it starts (or a retry tier is
// declared with other arguments than broker.WorkQueue gives it), or when
// Config.Conn or Config.PublishConn was closed.
func (c *Consumer) Run(ctx context.Context) error {
	defer func() { _ = c.pub.Close() }()
	defer c.retention().Start(ctx)()
	backoff := minBackoff
	for {
		err := c.checkTopology(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		var te *topologyError
		if errors.As(err, &te) || errors.Is(err, broker.ErrClosed) {
			return fmt.Errorf("consumer %q: %w", c.cfg.Name, err)
		}
		c.log.Warn("consumer cannot check its queues; retrying", slog.Any("error", err), slog.Duration("backoff", backoff))
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = nextBackoff(backoff)
	}

	backoff = minBackoff
	for {
		progress, err := c.session(ctx)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				c.log.Info("consumer stopped", slog.Any("last_error", err))
			}
			return nil
		}
		var ce *crashError
		if errors.As(err, &ce) {
			return err
		}
		if errors.Is(err, broker.ErrClosed) {
			return fmt.Errorf("consumer %q: %w", c.cfg.Name, err)
		}
		if restartsAfresh(progress, err) {
			backoff = minBackoff
		}
		c.log.Warn("consumer session ended; starting a new one", slog.Any("error", err), slog.Duration("backoff", backoff))
		c.tel.metrics.ConsumerRestarted(ctx, c.tel.labels)
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = nextBackoff(backoff)
	}
}

// checkTopology verifies that the work queue, the parking lot and every tier
// the retry policy can use exist.
func (c *Consumer) checkTopology(ctx context.Context) error {
	// The queues broker.WorkQueue declares for the policy (whatever the
	// type: only the names matter here). It stops at the last tier, which
	// is reused, so a budget of math.MaxInt attempts is no longer to check
	// than one of len(Tiers)+1.
	var queues []string
	for _, q := range broker.WorkQueue(c.cfg.Queue, "", c.cfg.Retry) {
		queues = append(queues, q.Name)
	}
	ch, err := c.cfg.Conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, q := range queues {
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
				return &topologyError{queue: q}
			}
			return fmt.Errorf("check queue %q: %w", q, err)
		}
	}
	return c.checkTiers(ctx)
}

// checkTiers verifies that every tier queue delays and dead-letters the way
// broker.WorkQueue declares it, of either queue type: a tier that exists
// without that (declared by hand, by another tool, or with another TTL under
// the name) would drop every retry when its TTL expires, or route it
// elsewhere, and nothing would say so. A passive declare cannot see
// arguments; declaring the tier again as WorkQueue does changes nothing when
// they match, and the broker refuses it (PRECONDITION_FAILED, which closes
// the channel) when they do not, naming one argument that differs. Run
// refuses to start when that is the TTL or the dead-letter exchange or
// routing key (they are the same for either queue type, so the difference is
// real). A tier that differs only in other arguments (a lazy classic queue,
// a delivery limit) returns its retries; when neither declaration names one
// of the three, the consumer cannot tell whether they match too, logs the
// broker's answers and starts. A consumer whose user may not declare queues
// (ACCESS_REFUSED) cannot check either: it logs that and goes on.
func (c *Consumer) checkTiers(ctx context.Context) error {
	type tier struct {
		name string
		as   []broker.Queue // the tier as WorkQueue declares it, by queue type
	}
	var tiers []tier
	for i, qt := range []broker.QueueType{broker.QueueQuorum, broker.QueueClassic} {
		qs := broker.WorkQueue(c.cfg.Queue, qt, c.cfg.Retry)
		for j, q := range qs[1 : len(qs)-1] {
			if i == 0 {
				tiers = append(tiers, tier{name: q.Name})
			}
			tiers[j].as = append(tiers[j].as, q)
		}
	}
	first := 0 // the queue type to try first: the one the last tier matched
tiers:
	for _, t := range tiers {
		var differ []string
		for k := range t.as {
			q := t.as[(first+k)%len(t.as)]
			err := c.redeclare(ctx, q)
			var amqpErr *amqp.Error
			switch {
			case err == nil:
				first = (first + k) % len(t.as)
				continue tiers
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
				c.log.Warn("cannot check the arguments of a retry tier (no permission to declare it); make sure it dead-letters back to the work queue",
					slog.String("tier", t.name), slog.Any("error", err))
				continue tiers
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed:
				if slices.Contains(retryArgs, inequivalentArg(amqpErr.Reason)) {
					return &topologyError{queue: t.name, mismatch: fmt.Errorf("as a %s queue: %s", q.Type, amqpErr.Reason)}
				}
				differ = append(differ, fmt.Sprintf("as a %s queue: %s", q.Type, amqpErr.Reason))
			default:
				return fmt.Errorf("check the arguments of queue %q: %w", t.name, err)
			}
		}
		c.log.Warn("a retry tier has other arguments than broker.WorkQueue gives it; the broker named none of its delay and dead-letter arguments, so those were not checked: make sure it dead-letters back to the work queue",
			slog.String("tier", t.name), slog.String("differences", strings.Join(differ, "; ")))
	}
	return nil
}

// retryArgs are the tier arguments a retry's return depends on.
var retryArgs = []string{broker.ArgMessageTTL, broker.ArgDeadLetterExchange, broker.ArgDeadLetterRoutingKey}

// inequivalentArg returns the argument a PRECONDITION_FAILED reason of
// queue.declare names ("inequivalent arg 'x-message-ttl' for queue ..."),
// or "".
func inequivalentArg(reason string) string {
	const prefix = "inequivalent arg '"
	i := strings.Index(reason, prefix)
	if i < 0 {
		return ""
	}
	rest := reason[i+len(prefix):]
	if j := strings.IndexByte(rest, '\''); j >= 0 {
		return rest[:j]
	}
	return ""
}

// redeclare declares q on a channel of its own (a refusal closes it).
func (c *Consumer) redeclare(ctx context.Context, q broker.Queue) error {
	ch, err := c.cfg.Conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	return broker.Declare(ctx, ch, broker.Topology{Queues: []broker.Queue{q}})
}

// session is one consuming channel's lifetime.
type session struct {
	c        *Consumer
	ch       *amqp.Channel
	acker    *acker
	work     chan amqp.Delivery
	stop     chan struct{}
	failed   chan error
	progress atomic.Bool

	// busy holds each worker's batch while it is handled, for the log of
	// a drain that gives up on it.
	busyMu sync.Mutex
	busy   map[int][]amqp.Delivery
}

// setBusy records (batch not nil) or clears worker w's batch.
func (s *session) setBusy(w int, batch []amqp.Delivery) {
	s.busyMu.Lock()
	defer s.busyMu.Unlock()
	if batch == nil {
		delete(s.busy, w)
		return
	}
	s.busy[w] = batch
}

// busyIDs returns the message ids of the batches being handled.
func (s *session) busyIDs() []string {
	s.busyMu.Lock()
	defer s.busyMu.Unlock()
	var ids []string
	for _, batch := range s.busy {
		for i := range batch {
			ids = append(ids, batch[i].MessageId)
		}
	}
	slices.Sort(ids)
	return ids
}

// session consumes on a new channel until ctx is cancelled, the channel or
// the publishing channel closes, or a worker meets a failure that leaves
// deliveries unacknowledged (database or publish failure). progress reports
// whether any delivery was acknowledged.
func (c *Consumer) session(ctx context.Context) (progress bool, err error) {
	if err := c.cfg.Pool.Ping(ctx); err != nil {
		return false, fmt.Errorf("database unavailable: %w", err)
	}
	c.clearInterrupted(ctx)
	ch, err := c.cfg.Conn.Channel(ctx)
	if err != nil {
		return false, fmt.Errorf("open consuming channel: %w", err)
	}
	// cancelled is closed once the drain's consumer cancel has its answer
	// (nil: no cancel was sent).
	var cancelled chan struct{}
	defer func() { c.closeChannel(ch, cancelled) }()

	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("set prefetch %d: %w", c.cfg.Prefetch, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := c.consumerTag()
	deliveries, err := ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume queue %q: %w", c.cfg.Queue, err)
	}

	s := &session{
		c:      c,
		ch:     ch,
		acker:  newAcker(ch),
		work:   make(chan amqp.Delivery, c.cfg.Prefetch),
		stop:   make(chan struct{}),
		failed: make(chan error, 1),
		busy:   make(map[int][]amqp.Delivery),
	}
	// In-flight work outlives ctx: shutdown drains it. Cancelled only when
	// the drain times out or the session crashes.
	procCtx, procCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer procCancel()

	c.current.Store(s)
	defer c.current.Store(nil)
	dispatched := make(chan struct{})
	go s.dispatch(deliveries, dispatched)
	var wg sync.WaitGroup
	for w := range c.cfg.Concurrency {
		wg.Go(func() { s.worker(procCtx, w) })
	}
	c.log.Debug("consumer session started", slog.String("consumer_tag", tag))

	var reason error
	select {
	case <-ctx.Done():
		reason = ctx.Err()
	case e := <-closed:
		reason = fmt.Errorf("consuming channel closed: %w", amqpCloseError(e))
	case <-dispatched:
		reason = errors.New("the broker cancelled the consumer")
	case err := <-s.failed:
		reason = err
	}
	close(s.stop)

	var crash *crashError
	if errors.As(reason, &crash) {
		// Simulated crash: acknowledge nothing more, drop the channel.
		s.acker.close()
		procCancel()
		_ = ch.Close()
		wg.Wait()
		return s.progress.Load(), reason
	}

	// Stop consuming, then drain: workers finish their current batch and
	// acknowledge it; prefetched deliveries nobody started are returned to
	// the queue when the channel closes. The cancel waits for the broker's
	// answer, which a broker that stopped reading the connection (a
	// resource alarm blocks a connection that publishes; a half-dead
	// network path) never sends: it runs on its own, so that it cannot hold
	// the drain past DrainTimeout.
	timer := time.NewTimer(c.cfg.DrainTimeout)
	defer timer.Stop()
	if !ch.IsClosed() {
		cancelled = make(chan struct{})
		go func() {
			defer close(cancelled)
			_ = ch.Cancel(tag, false)
		}()
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-timer.C:
		c.log.Warn("drain timed out; cancelling in-flight deliveries", slog.Duration("drain_timeout", c.cfg.DrainTimeout))
		procCancel()
		// A handler that ignores its cancelled context is not waited for
		// without end: after DrainTimeout more the session ends without
		// it. Its deliveries are not acknowledged (the acker is closed
		// below), so they come again; if its transaction commits after
		// all, the inbox makes the redelivery a duplicate.
		timer.Reset(c.cfg.DrainTimeout)
		select {
		case <-drained:
		case <-timer.C:
			c.log.Error("handlers did not return after their context was cancelled; stopping without them (their messages are redelivered)",
				slog.Any("message_ids", s.busyIDs()), slog.Duration("waited", 2*c.cfg.DrainTimeout))
		}
	}
	s.acker.close()
	return s.progress.Load(), reason
}

// closeChannel closes ch once the consumer cancel in flight on it (if
// cancelled is not nil) has its answer (amqp091-go cannot wait for two
// answers on one channel at once), waiting at most DrainTimeout in all for
// the broker (see the drain in session).
func (c *Consumer) closeChannel(ch *amqp.Channel, cancelled <-chan struct{}) {
	t := time.NewTimer(c.cfg.DrainTimeout)
	defer t.Stop()
	// The close waits for the cancel's answer, in the background when the
	// broker is not answering: once it answers again (an alarm cleared),
	// the channel closes and its prefetched deliveries go back to the
	// queue; until then they wait with the connection.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		if cancelled != nil {
			<-cancelled
		}
		_ = ch.Close()
	}()
	select {
	case <-closed:
	case <-t.C:
		c.log.Warn("the broker did not answer the consuming channel's cancel or close; closing it in the background",
			slog.Duration("waited", c.cfg.DrainTimeout))
	}
}

// amqpCloseError turns a close notification into an error (nil means a
// graceful close).
func amqpCloseError(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
	}
	return e
}

// dispatch moves deliveries to the workers, registering each tag with the
// acker before any worker can see it. It closes done when the delivery
// stream ends (channel closed or consumer cancelled by the broker).
func (s *session) dispatch(deliveries <-chan amqp.Delivery, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-s.stop:
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			s.acker.add(d.DeliveryTag)
			select {
			case s.work <- d:
			case <-s.stop:
				return
			}
		}
	}
}

// worker handles batches until the session stops or a batch fails in a way
// that needs a new session.
func (s *session) worker(ctx context.Context, w int) {
	for {
		batch := s.next()
		if batch == nil {
			return
		}
		s.setBusy(w, batch)
		err := s.handle(ctx, batch, true)
		s.setBusy(w, nil)
		if err != nil {
			select {
			case s.failed <- err:
			default:
			}
			return
		}
	}
}

// next waits for a delivery and adds the ones already waiting, up to
// BatchSize. It returns nil when the session stops.
func (s *session) next() []amqp.Delivery {
	var first amqp.Delivery
	select {
	case <-s.stop:
		return nil
	case first = <-s.work:
	}
	select {
	case <-s.stop:
		return nil // left unacknowledged: requeued when the channel closes
	default:
	}
	batch := []amqp.Delivery{first}
	for len(batch) < s.c.cfg.BatchSize {
		select {
		case d := <-s.work:
			batch = append(batch, d)
		default:
			return batch
		}
	}
	return batch
}

// consumerTag returns a tag unique to this consumer session.
func (c *Consumer) consumerTag() string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return c.cfg.Name + "." + hex.EncodeToString(b[:])
}

// sleep waits d, or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// restartsAfresh reports whether the next session may start after the
// shortest backoff: the last one acknowledged something, and did not end
// because a retry or parked copy could not be published. That failure
// repeats for as long as its cause (a tier queue or parking lot deleted
// under the consumer, a broker refusing them) does, and the deliveries
// acknowledged around it must not keep its backoff short, or the same
// message would be handled and fail to be routed ten times a second.
func restartsAfresh(progress bool, err error) bool {
	var re *routeError
	return progress && !errors.As(err, &re)
}

// nextBackoff doubles d up to maxBackoff, with ±25% jitter so that many
// consumers do not reconnect in lockstep.
func nextBackoff(d time.Duration) time.Duration {
	d *= 2
	if d > maxBackoff {
		d = maxBackoff
	}
	jitter := time.Duration(rand.Int64N(int64(d) / 2))
	return d - d/4 + jitter
}
