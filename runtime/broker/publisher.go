package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publish outcomes other than success. Every one of them means "not known to
// be routed to a queue: publish again" — the broker may still hold a copy,
// so consumers dedupe on the message id (at-least-once).
var (
	// ErrNacked: the broker refused responsibility for the message.
	ErrNacked = errors.New("broker nacked the message")
	// ErrReturned: the message was unroutable (no queue bound for its
	// routing key) and came back, since every publish is mandatory. The
	// broker still confirms such a message, so without this check it
	// would be silently dropped.
	ErrReturned = errors.New("broker returned the message as unroutable")
	// ErrConfirmTimeout: no confirm arrived within ConfirmTimeout.
	ErrConfirmTimeout = errors.New("publisher confirm timed out")
	// ErrChannelClosed: the channel or connection closed before the
	// confirm arrived.
	ErrChannelClosed = errors.New("channel closed before the publisher confirm")
	// ErrNotSent: an earlier failure in the batch stopped the publisher
	// before it sent this message.
	ErrNotSent = errors.New("message not sent")
	// ErrNoExchange: the message's exchange does not exist. Publisher
	// checks each exchange (passively, on a scratch channel) before its
	// first use, because publishing to a missing exchange makes the broker
	// close the channel and fail every other message in flight: one bad row
	// would otherwise block everything behind it.
	ErrNoExchange = errors.New("exchange does not exist")
	// ErrBlocked: the broker has blocked the connection (a memory or disk
	// alarm); nothing is published on it until the alarm clears.
	ErrBlocked = errors.New("broker blocked the connection")
)

// PublisherConfig tunes a Publisher. The zero value is usable.
type PublisherConfig struct {
	// Window is the maximum number of published messages awaiting their
	// confirm, counted across every Send still in flight; 0 means 256.
	// One-at-a-time confirms cost an order of magnitude in throughput; an
	// unbounded window costs memory and makes a failure republish
	// everything.
	Window int
	// ConfirmTimeout is how long the publisher waits for the oldest
	// outstanding confirm before giving up on every outstanding message;
	// 0 means 30 s.
	ConfirmTimeout time.Duration
}

// Outgoing is one message to publish.
type Outgoing struct {
	Exchange, RoutingKey string
	// Publishing must have a MessageId: returns are matched to messages by
	// it.
	Publishing amqp.Publishing
}

// Publisher publishes messages with publisher confirms on one channel of a
// Conn. It is safe for concurrent use; calls to Send are serialized, so the
// messages of one call go out in order and back to back.
//
// The channel is in confirm mode and every publish is mandatory.
// [Publisher.Send] publishes a batch and returns as soon as the last message
// is written, with a [Pending] whose Wait reports per message whether the
// broker confirmed it AND routed it; [Publisher.Publish] is Send followed by
// Wait. Confirms and returns are collected by a goroutine of the publisher,
// not by the caller, so a caller may send the next batch while the confirms
// of the previous one are still on their way: at most Window messages are
// unconfirmed at any time, whichever batches they belong to, and Send waits
// only for a free slot in that window. Returns are drained continuously
// from a buffered channel, so the client library never drops one.
//
// A nack or a return fails only its message. A confirm timeout or the loss
// of the channel or connection fails every outstanding message that was not
// already confirmed; the channel is then discarded (its confirms can no
// longer be trusted) and the next Send opens a fresh one, which waits for
// the Conn to reconnect.
type Publisher struct {
	conn *Conn
	cfg  PublisherConfig

	mu    sync.Mutex // serializes Send and Close; guards sess and known
	sess  *session
	known map[string]bool // exchanges seen to exist
}

// NewPublisher returns a publisher on conn. It opens its channel lazily.
func NewPublisher(conn *Conn, cfg PublisherConfig) *Publisher {
	if cfg.Window <= 0 {
		cfg.Window = 256
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	return &Publisher{conn: conn, cfg: cfg, known: map[string]bool{"": true}}
}

// checkExchanges fails the messages whose exchange does not exist. An
// exchange is checked once; the cache is cleared when the broker closes a
// channel with NOT_FOUND (an exchange was deleted).
func (p *Publisher) checkExchanges(ctx context.Context, msgs []Outgoing, errs []error) error {
	missing := map[string]bool{}
	var scratch *amqp.Channel
	defer func() {
		if scratch != nil {
			_ = scratch.Close()
		}
	}()
	for i, m := range msgs {
		if errs[i] != nil || p.known[m.Exchange] {
			continue
		}
		if !missing[m.Exchange] {
			if scratch == nil {
				var err error
				if scratch, err = p.conn.Channel(ctx); err != nil {
					return err
				}
			}
			// A passive declare checks only that the name exists: the
			// kind and flags are not compared, so any exchange passes.
			err := scratch.ExchangeDeclarePassive(m.Exchange, "", true, false, false, false, nil)
			var amqpErr *amqp.Error
			switch {
			case err == nil:
				p.known[m.Exchange] = true
				continue
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
				missing[m.Exchange] = true
				scratch = nil // the broker closed it
			default:
				return fmt.Errorf("check exchange %q: %w", m.Exchange, err)
			}
		}
		errs[i] = fmt.Errorf("%w: %q", ErrNoExchange, m.Exchange)
	}
	return nil
}

// Close closes the publisher's channel, failing whatever still awaits a
// confirm. A later Send opens a new channel.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sess; s != nil {
		s.kill(fmt.Errorf("%w: publisher closed", ErrChannelClosed))
		<-s.exited
		p.sess = nil
	}
	return nil
}

// session returns the live session, opening one (and a channel) when there
// is none or the last one died.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	if s := p.sess; s != nil {
		if !s.isKilled() && !s.ch.IsClosed() {
			return s, nil
		}
		s.kill(fmt.Errorf("%w: channel closed", ErrChannelClosed))
		<-s.exited
		if e := s.finalCloseReason(); e != nil && e.Code == amqp.NotFound {
			clear(p.known) // an exchange vanished since it was checked
			p.known[""] = true
		}
		p.sess = nil // its goroutine finishes on its own
	}
	ch, err := p.conn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("put channel in confirm mode: %w", err)
	}
	s := &session{
		ch:      ch,
		timeout: p.cfg.ConfirmTimeout,
		slots:   make(chan struct{}, p.cfg.Window),
		fifo:    make(chan *inflight, p.cfg.Window),
		// A return can only be pending for an outstanding message, so a
		// buffer of Window never blocks the client's reader.
		returns: ch.NotifyReturn(make(chan amqp.Return, p.cfg.Window+1)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		dead:    make(chan struct{}),
		exited:  make(chan struct{}),
		byID:    map[string][]*inflight{},
	}
	go s.run()
	p.sess = s
	return s, nil
}

// Send publishes msgs in order and returns once they are written, without
// waiting for their confirms (it waits only while Window messages are
// unconfirmed). The outcome comes from the returned Pending's Wait. ctx
// bounds the sending, including the wait for room in the window.
func (p *Publisher) Send(ctx context.Context, msgs []Outgoing) *Pending {
	pd := &Pending{msgs: msgs, errs: make([]error, len(msgs)), waiting: make([]bool, len(msgs)), done: make(chan struct{})}
	defer pd.seal()
	if len(msgs) == 0 {
		return pd
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	fail := func(from int, err error) {
		for i := from; i < len(msgs); i++ {
			if pd.errs[i] == nil {
				pd.errs[i] = err
			}
		}
	}
	for i := range msgs {
		if msgs[i].Publishing.MessageId == "" {
			pd.errs[i] = errors.New("publish: message id required (returns are matched by it)")
		} else if err := checkOutgoing(&msgs[i]); err != nil {
			pd.errs[i] = fmt.Errorf("publish %s: %w", truncateName(msgs[i].Publishing.MessageId), err)
		}
	}
	if reason, blocked := p.conn.Blocked(); blocked {
		fail(0, fmt.Errorf("%w: %w: %s", ErrNotSent, ErrBlocked, reason))
		return pd
	}
	s, err := p.session(ctx)
	if err != nil {
		fail(0, fmt.Errorf("%w: %w", ErrNotSent, err))
		return pd
	}
	if err := p.checkExchanges(ctx, msgs, pd.errs); err != nil {
		fail(0, fmt.Errorf("%w: %w", ErrNotSent, err))
		return pd
	}
	for i := range msgs {
		if pd.errs[i] != nil {
			continue
		}
		if err := s.publish(ctx, pd, i); err != nil {
			pd.errs[i] = err
			fail(i+1, ErrNotSent)
			break
		}
	}
	return pd
}

// Publish publishes msgs in order and waits for their confirms: Send, then
// Wait. It returns one error per message, in the same order: nil means the
// broker confirmed the message and routed it to at least one queue; any
// error means the caller must publish it again later. Publish never returns
// before every sent message is resolved (confirmed, failed, or abandoned
// with ErrConfirmTimeout or ctx's error).
func (p *Publisher) Publish(ctx context.Context, msgs []Outgoing) []error {
	return p.Send(ctx, msgs).Wait(ctx)
}

// Pending is the outcome of one Send, to be collected with Wait.
type Pending struct {
	msgs []Outgoing
	errs []error
	done chan struct{} // closed once sealed and nothing is open

	mu       sync.Mutex
	open     int    // messages sent and not yet resolved
	waiting  []bool // per message: sent and not yet resolved
	sealed   bool   // Send has returned
	detached bool   // Wait gave up on ctx; later outcomes are dropped
}

// Wait waits until every message of the Send is resolved and returns one
// error per message, in order: nil means the broker confirmed the message
// and routed it to at least one queue; any error means the caller must
// publish it again later. When ctx ends first, the messages still awaiting
// their confirm are reported as failed with ctx's error (their confirms,
// should they come, are ignored).
func (pd *Pending) Wait(ctx context.Context) []error {
	select {
	case <-pd.done:
		return pd.errs
	default:
	}
	select {
	case <-pd.done:
		return pd.errs
	case <-ctx.Done():
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	pd.detached = true
	for i, w := range pd.waiting {
		if w {
			pd.errs[i] = fmt.Errorf("waiting for publisher confirm: %w", ctx.Err())
		}
	}
	return pd.errs
}

func (pd *Pending) seal() {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	pd.sealed = true
	if pd.open == 0 {
		close(pd.done)
	}
}

func (pd *Pending) sent(i int) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	pd.open++
	pd.waiting[i] = true
}

func (pd *Pending) resolve(i int, err error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	pd.waiting[i] = false
	if !pd.detached {
		pd.errs[i] = err
	}
	pd.open--
	if pd.open == 0 && pd.sealed {
		close(pd.done)
	}
}
