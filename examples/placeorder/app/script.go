package app

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
)

// Script injects faults into the participants, per order id and command type,
// so the demo and the tests can provoke every failure path of the saga on
// real infrastructure. Business failures need no script: they come from the
// data (a product without stock, DeclinedCard).
//
// A Script is safe for concurrent use. Its state lives in memory: it is a
// test fixture, not something a production service would run.
type Script struct {
	mu         sync.Mutex
	failures   map[scriptKey]int // transient failures still to inject
	deliveries map[scriptKey]int
	hold       map[scriptKey]bool
	duplicate  map[scriptKey]bool
	held       map[string][]heldReply // by order id, oldest first
	heldIDs    map[string]bool        // command message ids already held
	pause      map[scriptKey]*pause
}

// pause holds one delivery in its handler: entered is closed when it
// arrives, release when it may go on.
type pause struct{ entered, release chan struct{} }

type scriptKey struct{ orderID, command string }

// heldReply is a reply a participant computed but did not send.
type heldReply struct {
	command envelope.Envelope
	reply   message.Message
}

// NewScript returns an empty script: every participant behaves normally.
func NewScript() *Script {
	return &Script{
		failures:   map[scriptKey]int{},
		deliveries: map[scriptKey]int{},
		hold:       map[scriptKey]bool{},
		duplicate:  map[scriptKey]bool{},
		held:       map[string][]heldReply{},
		heldIDs:    map[string]bool{},
		pause:      map[scriptKey]*pause{},
	}
}

// Pause holds the next delivery of command for orderID in its handler,
// before any effect, until resume is called (or the handler's context
// ends); paused is closed once it is held. Later deliveries are not held.
func (s *Script) Pause(orderID, command string) (paused <-chan struct{}, resume func()) {
	p := &pause{entered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.pause[scriptKey{orderID, command}] = p
	s.mu.Unlock()
	var once sync.Once
	return p.entered, func() { once.Do(func() { close(p.release) }) }
}

// paused takes the pause set for k, if any.
func (s *Script) paused(k scriptKey) *pause {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pause[k]
	delete(s.pause, k)
	return p
}

// FailTransiently makes the next times deliveries of command (a message full
// name) for orderID fail with a transient error, before any effect: the
// consumer retries them through its retry tiers.
func (s *Script) FailTransiently(orderID, command string, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[scriptKey{orderID, command}] = times
}

// HoldReplies makes the participant apply command for orderID but keep its
// reply instead of sending it — a participant that never answers, or answers
// late once App.SendHeldReply releases the reply. Resent commands are held too.
func (s *Script) HoldReplies(orderID, command string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold[scriptKey{orderID, command}] = true
}

// DuplicateReplies makes the participant answer command for orderID twice,
// as two messages with different ids (a participant that is not
// exactly-once on its sending side).
func (s *Script) DuplicateReplies(orderID, command string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.duplicate[scriptKey{orderID, command}] = true
}

// Deliveries returns how many deliveries of command for orderID reached the
// participant, failed ones included.
func (s *Script) Deliveries(orderID, command string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deliveries[scriptKey{orderID, command}]
}

// Held returns how many replies for orderID are held and not yet sent.
func (s *Script) Held(orderID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held[orderID])
}

type scriptAction int

const (
	actNone scriptAction = iota
	actFail
	actHold
	actDuplicate
)

func (s *Script) next(k scriptKey) scriptAction {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deliveries[k]++
	switch {
	case s.failures[k] > 0:
		s.failures[k]--
		return actFail
	case s.hold[k]:
		return actHold
	case s.duplicate[k]:
		return actDuplicate
	}
	return actNone
}

func (s *Script) stash(orderID string, cmd envelope.Envelope, reply message.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldIDs[cmd.MessageID] {
		return // the same delivery handled again after a rolled-back batch
	}
	s.heldIDs[cmd.MessageID] = true
	s.held[orderID] = append(s.held[orderID], heldReply{command: cmd, reply: reply})
}

func (s *Script) take(orderID string) (heldReply, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.held[orderID]
	if len(q) == 0 {
		return heldReply{}, false
	}
	s.held[orderID] = q[1:]
	return q[0], true
}

func (s *Script) putBack(orderID string, h heldReply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[orderID] = append([]heldReply{h}, s.held[orderID]...)
}

// scripted wraps a participant's generated handler with the script's faults.
func (a *App) scripted(h consumer.HandlerFunc) consumer.HandlerFunc {
	s := a.cfg.Script
	if s == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		k := scriptKey{d.Message.CorrelationKey(), d.Envelope.MessageType}
		if p := s.paused(k); p != nil {
			close(p.entered)
			select {
			case <-p.release:
			case <-ctx.Done(): // the drain ran out
				return ctx.Err()
			}
		}
		switch s.next(k) {
		case actFail:
			return failure.Transient(fmt.Errorf("scripted transient failure of %s for order %s (attempt %d)",
				k.command, k.orderID, d.Attempt))
		case actHold:
			reply, err := a.answer(ctx, tx, d)
			if err != nil {
				return err
			}
			s.stash(k.orderID, d.Envelope, reply)
			return nil
		case actDuplicate:
			if err := h(ctx, tx, d); err != nil {
				return err
			}
			// The effect is applied once; participant.Idempotent replays
			// its reply, which goes out a second time with a new id.
			reply, err := a.answer(ctx, tx, d)
			if err != nil {
				return err
			}
			return sendReply(ctx, tx, &d.Envelope, reply)
		}
		return h(ctx, tx, d)
	}
}

// SendHeldReply sends the oldest reply the script held for orderID, in a
// transaction of its own, as the participant would when it answers late
// (participant.ReplyEnvelope: causation = the command it answers). It reports
// false when no reply is held.
func (a *App) SendHeldReply(ctx context.Context, orderID string) (bool, error) {
	if a.cfg.Script == nil {
		return false, nil
	}
	h, ok := a.cfg.Script.take(orderID)
	if !ok {
		return false, nil
	}
	err := pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		return sendReply(ctx, tx, &h.command, h.reply)
	})
	if err != nil {
		a.cfg.Script.putBack(orderID, h)
		return false, fmt.Errorf("send held reply for order %s: %w", orderID, err)
	}
	return true, nil
}

func sendReply(ctx context.Context, tx pgx.Tx, cmd *envelope.Envelope, reply message.Message) error {
	env, err := participant.ReplyEnvelope(cmd, reply)
	if err != nil {
		return err
	}
	if err := outbox.Enqueue(ctx, tx, env); err != nil {
		return fmt.Errorf("enqueue reply %s to %s %s: %w", env.MessageType, cmd.MessageType, cmd.MessageID, err)
	}
	return nil
}
