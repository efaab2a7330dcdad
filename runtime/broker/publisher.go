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
)

// PublisherConfig tunes a Publisher. The zero value is usable.
type PublisherConfig struct {
	// Window is the maximum number of published messages awaiting their
	// confirm; 0 means 256. One-at-a-time confirms cost an order of
	// magnitude in throughput; an unbounded window costs memory and makes
	// a failure republish everything.
	Window int
	// ConfirmTimeout is how long Publish waits for the next confirm before
	// giving up on every outstanding message; 0 means 30 s.
	ConfirmTimeout time.Duration
}

// Outgoing is one message to publish.
type Outgoing struct {
	Exchange, RoutingKey string
	// Publishing must have a MessageId: returns are matched to messages by
	// it.
	Publishing amqp.Publishing
}

// Publisher publishes batches with publisher confirms on one channel of a
// Conn. It is safe for concurrent use; calls to Publish are serialized.
//
// The channel is in confirm mode and every publish is mandatory. Publish
// keeps at most Window messages unconfirmed, listens for returns (drained
// continuously from a buffered channel, so the client library never drops
// one), and reports per message whether the broker confirmed it AND routed
// it. On a nack, return, timeout or channel/connection loss it reports the
// affected messages as failed; after any failure other than a nack or
// return it discards the channel (confirms can no longer be trusted) and
// opens a fresh one on the next call, which waits for the Conn to
// reconnect.
type Publisher struct {
	conn *Conn
	cfg  PublisherConfig

	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
	known   map[string]bool // exchanges seen to exist
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
			err := scratch.ExchangeDeclarePassive(m.Exchange, "topic", true, false, false, false, nil)
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

// Close closes the publisher's channel. A later Publish opens a new one.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discard()
	return nil
}

func (p *Publisher) discard() {
	if p.ch != nil {
		_ = p.ch.Close()
		p.ch, p.returns, p.closes = nil, nil, nil
	}
}

func (p *Publisher) channel(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	p.discard()
	ch, err := p.conn.Channel(ctx)
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("put channel in confirm mode: %w", err)
	}
	// A return can only be pending for an outstanding message, so a buffer
	// of Window never blocks the client's reader.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, p.cfg.Window+1))
	p.closes = ch.NotifyClose(make(chan *amqp.Error, 1))
	p.ch = ch
	return nil
}

// Publish publishes msgs in order and waits for their confirms. It returns
// one error per message, in the same order: nil means the broker confirmed
// the message and routed it to at least one queue; any error means the
// caller must publish it again later. Publish never returns before every
// sent message is resolved (confirmed, failed, or abandoned with
// ErrConfirmTimeout or ctx's error).
func (p *Publisher) Publish(ctx context.Context, msgs []Outgoing) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	fail := func(from int, err error) {
		for i := from; i < len(msgs); i++ {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	for i, m := range msgs {
		if m.Publishing.MessageId == "" {
			errs[i] = errors.New("publish: message id required (returns are matched by it)")
		}
	}
	if err := p.channel(ctx); err != nil {
		fail(0, fmt.Errorf("%w: %w", ErrNotSent, err))
		return errs
	}
	if err := p.checkExchanges(ctx, msgs, errs); err != nil {
		fail(0, fmt.Errorf("%w: %w", ErrNotSent, err))
		return errs
	}

	b := batch{p: p, msgs: msgs, errs: errs, byID: map[string][]int{}, returned: map[int]amqp.Return{}}
	healthy := true
	for i, m := range msgs {
		if errs[i] != nil {
			continue
		}
		for len(b.queue) >= p.cfg.Window && healthy {
			healthy = b.resolveOldest(ctx)
		}
		if !healthy {
			fail(i, ErrNotSent)
			break
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, m.Publishing)
		if err != nil {
			errs[i] = fmt.Errorf("%w: publish to exchange %q with key %q: %w", ErrNotSent, m.Exchange, m.RoutingKey, err)
			fail(i+1, ErrNotSent)
			b.abandoned = fmt.Errorf("%w: %w", ErrChannelClosed, err)
			healthy = false
			break
		}
		b.queue = append(b.queue, pending{idx: i, dc: dc})
		b.byID[m.Publishing.MessageId] = append(b.byID[m.Publishing.MessageId], i)
	}
	for len(b.queue) > 0 && healthy {
		healthy = b.resolveOldest(ctx)
	}
	if b.closeErr != nil && b.closeErr.Code == amqp.NotFound {
		clear(p.known) // an exchange vanished since it was checked
		p.known[""] = true
	}
	if !healthy {
		// Confirms or returns for what is still outstanding can no longer
		// be matched: abandon the channel. Closing it nacks the deferred
		// confirms, so nothing is left waiting.
		for _, q := range b.queue {
			if errs[q.idx] == nil {
				errs[q.idx] = b.abandoned
			}
		}
		p.discard()
	}
	return errs
}

type pending struct {
	idx int
	dc  *amqp.DeferredConfirmation
}

// batch tracks one Publish call's outstanding messages.
type batch struct {
	p         *Publisher
	msgs      []Outgoing
	errs      []error
	queue     []pending
	byID      map[string][]int
	returned  map[int]amqp.Return
	closeErr  *amqp.Error
	abandoned error
}

// resolveOldest waits for the oldest outstanding confirm and records its
// outcome. It returns false when the channel must be abandoned (timeout,
// ctx done), with b.abandoned set.
func (b *batch) resolveOldest(ctx context.Context) bool {
	head := b.queue[0]
	timer := time.NewTimer(b.p.cfg.ConfirmTimeout)
	defer timer.Stop()
	for {
		select {
		case r, ok := <-b.p.returns:
			if !ok {
				b.p.returns = nil
				continue
			}
			b.recordReturn(r)
		case e, ok := <-b.p.closes:
			b.p.closes = nil // closed after one value; never read it again
			if ok && e != nil {
				b.closeErr = e
			}
		case <-head.dc.Done():
			// The client delivers a return before the confirm of the same
			// message, and a channel's close reason before nacking its
			// outstanding confirms, so both are buffered by now.
			b.drainReturns()
			b.drainClose()
			b.queue = b.queue[1:]
			b.errs[head.idx] = b.outcome(head)
			return true
		case <-timer.C:
			b.abandoned = fmt.Errorf("%w after %v", ErrConfirmTimeout, b.p.cfg.ConfirmTimeout)
			return false
		case <-ctx.Done():
			b.abandoned = fmt.Errorf("waiting for publisher confirm: %w", ctx.Err())
			return false
		}
	}
}

func (b *batch) drainReturns() {
	for b.p.returns != nil {
		select {
		case r, ok := <-b.p.returns:
			if !ok {
				b.p.returns = nil
				return
			}
			b.recordReturn(r)
		default:
			return
		}
	}
}

func (b *batch) drainClose() {
	select {
	case e, ok := <-b.p.closes:
		b.p.closes = nil
		if ok && e != nil {
			b.closeErr = e
		}
	default:
	}
}

func (b *batch) recordReturn(r amqp.Return) {
	// Message ids are unique in practice; if two outstanding messages share
	// one, both count as returned (a needless republish, never a loss).
	for _, i := range b.byID[r.MessageId] {
		b.returned[i] = r
	}
}

func (b *batch) outcome(q pending) error {
	m := b.msgs[q.idx]
	if r, ok := b.returned[q.idx]; ok {
		return fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrReturned, m.Exchange, m.RoutingKey, r.ReplyCode, r.ReplyText)
	}
	if q.dc.Acked() {
		return nil
	}
	if b.closeErr != nil || b.p.ch.IsClosed() {
		reason := "closed"
		if b.closeErr != nil {
			reason = b.closeErr.Error()
		}
		return fmt.Errorf("%w (exchange %q): %s", ErrChannelClosed, m.Exchange, reason)
	}
	return fmt.Errorf("%w (exchange %q, routing key %q)", ErrNacked, m.Exchange, m.RoutingKey)
}
