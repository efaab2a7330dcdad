package broker

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one confirm-mode channel and the goroutine (run) that resolves
// what was published on it, oldest first. It dies (kill) on a confirm
// timeout, when its channel closes, or when the publisher is closed; run
// then fails what is still outstanding, closes the channel and returns.
type session struct {
	ch      *amqp.Channel
	timeout time.Duration
	slots   chan struct{}  // one token per unconfirmed message: the window
	fifo    chan *inflight // published messages in publish order
	returns chan amqp.Return
	closes  chan *amqp.Error // read by run only; nil once read
	dead    chan struct{}    // closed by kill
	exited  chan struct{}    // closed when run returns

	mu        sync.Mutex
	byID      map[string][]*inflight // outstanding messages by message id
	killed    bool
	abandoned error       // why it was killed
	closeErr  *amqp.Error // why the broker closed the channel, once seen
}

// inflight is one published message awaiting its confirm.
type inflight struct {
	p        *Pending
	idx      int
	dc       *amqp.DeferredConfirmation
	returned *amqp.Return // guarded by session.mu
}

// publish publishes message i of pd once the window has room.
func (s *session) publish(ctx context.Context, pd *Pending, i int) error {
	select {
	case s.slots <- struct{}{}:
	default:
		select {
		case s.slots <- struct{}{}:
		case <-s.dead:
			return fmt.Errorf("%w: %w", ErrNotSent, s.reason())
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for room in the confirm window: %w", ErrNotSent, ctx.Err())
		}
	}
	m := &pd.msgs[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.killed {
		<-s.slots
		return fmt.Errorf("%w: %w", ErrNotSent, s.abandoned)
	}
	e := &inflight{p: pd, idx: i}
	id := m.Publishing.MessageId
	s.byID[id] = append(s.byID[id], e) // before publishing: the return may come at once
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, m.Publishing)
	if err != nil {
		s.forgetLocked(e)
		<-s.slots
		if ctx.Err() == nil {
			s.killLocked(fmt.Errorf("%w: %w", ErrChannelClosed, err))
		}
		return fmt.Errorf("%w: publish to exchange %q with key %q: %w", ErrNotSent, m.Exchange, m.RoutingKey, err)
	}
	e.dc = dc
	pd.sent(i)
	s.fifo <- e // never blocks: the slots keep it below capacity
	return nil
}

func (s *session) kill(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked(err)
}

func (s *session) killLocked(err error) {
	if !s.killed {
		s.killed, s.abandoned = true, err
		close(s.dead)
	}
}

func (s *session) isKilled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

func (s *session) reason() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned
}

func (s *session) closeReason() *amqp.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeErr
}

// finalCloseReason is closeReason once run has exited, including a close
// notification the client delivered after run's last look (the channel can
// report IsClosed before its notification is read). A channel closed by us
// has no reason and ends the wait at once; the wait is bounded regardless.
func (s *session) finalCloseReason() *amqp.Error {
	if e := s.closeReason(); e != nil {
		return e
	}
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case e, ok := <-s.closes:
		if ok {
			return e
		}
	case <-t.C:
	}
	return nil
}

func (s *session) forgetLocked(e *inflight) {
	id := e.p.msgs[e.idx].Publishing.MessageId
	list := s.byID[id]
	for i, x := range list {
		if x == e {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(s.byID, id)
	} else {
		s.byID[id] = list
	}
}

// run resolves published messages in publish order until the session is
// killed, then fails the rest and closes the channel.
func (s *session) run() {
	defer close(s.exited)
	timer := time.NewTimer(s.timeout)
	timer.Stop()
	for {
		select {
		case e := <-s.fifo:
			s.await(e, timer)
		case r, ok := <-s.returns:
			s.noteReturn(r, ok)
		case c, ok := <-s.closes:
			s.noteClose(c, ok)
		case <-s.dead:
			for {
				select {
				case e := <-s.fifo:
					s.finish(e)
				default:
					// The close waits for the broker's answer, which a
					// broker that blocked or stopped reading the
					// connection does not send: it must not hold the
					// session's end, which Send and Close wait for.
					go func() { _ = s.ch.Close() }()
					return
				}
			}
		}
	}
}

// await waits for e's confirm, at most the confirm timeout.
func (s *session) await(e *inflight, timer *time.Timer) {
	select {
	case <-e.dc.Done():
		s.finish(e)
		return
	default:
	}
	timer.Reset(s.timeout)
	defer timer.Stop()
	for {
		select {
		case <-e.dc.Done():
			s.finish(e)
			return
		case r, ok := <-s.returns:
			s.noteReturn(r, ok)
		case c, ok := <-s.closes:
			s.noteClose(c, ok)
		case <-timer.C:
			s.kill(fmt.Errorf("%w after %v", ErrConfirmTimeout, s.timeout))
			s.finish(e)
			return
		case <-s.dead:
			s.finish(e)
			return
		}
	}
}

// finish records e's outcome and frees its slot. A message whose confirm
// has not come when the session is dead fails with the reason it died.
func (s *session) finish(e *inflight) {
	// The client delivers a return before the confirm of the same message,
	// and a channel's close reason before nacking its outstanding confirms,
	// so both are buffered by the time the confirm is seen.
	s.drainReturns()
	s.drainClose()
	var err error
	select {
	case <-e.dc.Done():
		err = s.outcome(e)
	default:
		s.mu.Lock()
		s.forgetLocked(e)
		err = s.abandoned // not done: only after kill
		s.mu.Unlock()
	}
	<-s.slots
	e.p.resolve(e.idx, err)
}

func (s *session) outcome(e *inflight) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(e)
	m := &e.p.msgs[e.idx]
	if r := e.returned; r != nil {
		return fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrReturned, m.Exchange, m.RoutingKey, r.ReplyCode, r.ReplyText)
	}
	if e.dc.Acked() {
		return nil
	}
	if s.closeErr != nil || s.ch.IsClosed() {
		reason := "closed"
		if s.closeErr != nil {
			reason = s.closeErr.Error()
		}
		err := fmt.Errorf("%w (exchange %q): %s", ErrChannelClosed, m.Exchange, reason)
		s.killLocked(err)
		return err
	}
	// The channel is closed only after run has finished every message, so
	// a nack on an open channel is the broker's.
	return fmt.Errorf("%w (exchange %q, routing key %q)", ErrNacked, m.Exchange, m.RoutingKey)
}

func (s *session) noteReturn(r amqp.Return, ok bool) {
	if !ok {
		s.returns = nil
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Message ids are unique in practice; if two outstanding messages share
	// one, both count as returned (a needless republish, never a loss).
	for _, e := range s.byID[r.MessageId] {
		e.returned = &r
	}
}

func (s *session) noteClose(c *amqp.Error, ok bool) {
	s.closes = nil // closed after one value; never read it again
	s.mu.Lock()
	defer s.mu.Unlock()
	reason := "closed"
	if ok && c != nil {
		s.closeErr = c
		reason = c.Error()
	}
	s.killLocked(fmt.Errorf("%w: %s", ErrChannelClosed, reason))
}

func (s *session) drainReturns() {
	for s.returns != nil {
		select {
		case r, ok := <-s.returns:
			s.noteReturn(r, ok)
		default:
			return
		}
	}
}

func (s *session) drainClose() {
	if s.closes == nil {
		return
	}
	select {
	case c, ok := <-s.closes:
		s.noteClose(c, ok)
	default:
	}
}
