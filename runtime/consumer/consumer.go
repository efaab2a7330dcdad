package consumer

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/internal/retain"
	"github.com/protosaga/saga/runtime/retry"
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
	cfg   Config
	batch BatchHandler // Config.Batch, or Config.Handler
	log   *slog.Logger
	now   func() time.Time
	pub   *broker.Publisher // retry copies and parked messages
	tel   consumerTelemetry

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
	// pruned counts the inbox claims and dedupe rows the consumer deleted
	// (KeepClaims).
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
	batch := cfg.Batch
	if batch == nil {
		batch = cfg.Handler
	}
	return &Consumer{
		cfg:   cfg,
		batch: batch,
		log:   cfg.Logger.With(slog.String("consumer", cfg.Name), slog.String("queue", cfg.Queue)),
		now:   time.Now,
		pub:   broker.NewPublisher(cfg.PublishConn, broker.PublisherConfig{}),
		tel:   tel,
	}, nil
}

// retention deletes the consumer's inbox claims, and the handler's dedupe
// rows (Config.PruneDedupes), older than KeepClaims.
func (c *Consumer) retention() retain.Job {
	what := "inbox claims"
	if c.cfg.PruneDedupes != nil {
		what = "inbox claims and dedupe records"
	}
	return retain.Job{
		What: what, Keep: c.cfg.KeepClaims, Interval: c.cfg.PruneInterval,
		Clock: retain.DatabaseClock(c.cfg.Pool),
		Prune: func(ctx context.Context, olderThan time.Time) (int64, error) {
			n, err := inbox.PruneConsumer(ctx, c.cfg.Pool, c.cfg.Name, olderThan)
			if err != nil || c.cfg.PruneDedupes == nil {
				return n, err
			}
			m, err := c.cfg.PruneDedupes(ctx, olderThan)
			return n + m, err
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
	for attempt := 0; ; attempt++ {
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
		backoff := retry.Backoff(attempt, minBackoff, maxBackoff)
		c.log.Warn("consumer cannot check its queues; retrying", slog.Any("error", err), slog.Duration("backoff", backoff))
		if !sleep(ctx, backoff) {
			return nil
		}
	}

	for attempt := 0; ; attempt++ {
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
			attempt = 0
		}
		backoff := retry.Backoff(attempt, minBackoff, maxBackoff)
		c.log.Warn("consumer session ended; starting a new one", slog.Any("error", err), slog.Duration("backoff", backoff))
		c.tel.metrics.ConsumerRestarted(ctx, c.tel.labels)
		if !sleep(ctx, backoff) {
			return nil
		}
	}
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
