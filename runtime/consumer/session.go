package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
