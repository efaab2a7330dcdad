// Package script injects faults into the Place Order participants on demand,
// per order id and command type — transient errors, replies held back (a
// participant that never answers, or answers late with SendHeldReply),
// replies sent twice, a delivery paused in its handler — so the example's
// end-to-end tests and the demo drive every path of the saga through the real
// runtime. It is a participant middleware (host.Config.ParticipantMiddleware):
// the business code knows nothing of it. Its state lives in memory; it is a
// test fixture, not something a production service would run.
package script

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// Script holds the faults to inject. It is safe for concurrent use.
type Script struct {
	mu         sync.Mutex
	failures   map[key]int // transient failures still to inject
	deliveries map[key]int
	hold       map[key]bool
	duplicate  map[key]bool
	held       map[string][]heldReply // by order id, oldest first
	heldIDs    map[string]bool        // command message ids already held
	pause      map[key]*pause
}

// pause holds one delivery in its handler: entered is closed when it
// arrives, release when it may go on.
type pause struct{ entered, release chan struct{} }

type key struct{ orderID, command string }

// heldReply is a reply a participant computed but did not send.
type heldReply struct {
	command participant.Pending
	reply   message.Message
}

// New returns an empty script: every participant behaves normally.
func New() *Script {
	return &Script{
		failures:   map[key]int{},
		deliveries: map[key]int{},
		hold:       map[key]bool{},
		duplicate:  map[key]bool{},
		held:       map[string][]heldReply{},
		heldIDs:    map[string]bool{},
		pause:      map[key]*pause{},
	}
}

// Pause holds the next delivery of command for orderID in its handler,
// before any effect, until resume is called (or the handler's context
// ends); paused is closed once it is held. Later deliveries are not held.
func (s *Script) Pause(orderID, command string) (paused <-chan struct{}, resume func()) {
	p := &pause{entered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.pause[key{orderID, command}] = p
	s.mu.Unlock()
	var once sync.Once
	return p.entered, func() { once.Do(func() { close(p.release) }) }
}

// FailTransiently makes the next times deliveries of command (a message full
// name) for orderID fail with a transient error, before any effect: the
// consumer retries them through its retry tiers.
func (s *Script) FailTransiently(orderID, command string, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[key{orderID, command}] = times
}

// HoldReplies makes the participant apply command for orderID but keep its
// reply instead of sending it — a participant that never answers, or answers
// late once SendHeldReply releases the reply. Resent commands are held too.
func (s *Script) HoldReplies(orderID, command string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold[key{orderID, command}] = true
}

// DuplicateReplies makes the participant answer command for orderID twice,
// as two messages with different ids (a participant that is not
// exactly-once on its sending side).
func (s *Script) DuplicateReplies(orderID, command string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.duplicate[key{orderID, command}] = true
}

// Deliveries returns how many deliveries of command for orderID reached the
// participant, failed ones included.
func (s *Script) Deliveries(orderID, command string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deliveries[key{orderID, command}]
}

// Held returns how many replies for orderID are held and not yet sent.
func (s *Script) Held(orderID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held[orderID])
}

type action int

const (
	actNone action = iota
	actFail
	actHold
	actDuplicate
)

func (s *Script) next(k key) action {
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

// taken removes and returns the pause set for k, if any.
func (s *Script) taken(k key) *pause {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pause[k]
	delete(s.pause, k)
	return p
}

func (s *Script) stash(orderID string, cmd participant.Pending, reply message.Message) {
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

// Middleware injects the script's faults around every participant
// (host.Config.ParticipantMiddleware). Commands are keyed by their
// correlation key, the order id.
func (s *Script) Middleware(_ string, next participant.Func) participant.Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		k := key{cmd.CorrelationKey(), cmd.SagaMessageInfo().FullName}
		if p := s.taken(k); p != nil {
			close(p.entered)
			select {
			case <-p.release:
			case <-ctx.Done(): // the drain ran out
				return nil, ctx.Err()
			}
		}
		switch s.next(k) {
		case actFail:
			return nil, retry.Transient(fmt.Errorf("scripted transient failure of %s for order %s", k.command, k.orderID))
		case actHold:
			reply, err := next(ctx, tx, cmd)
			if err != nil || reply == nil {
				return nil, err
			}
			pending, err := participant.Later(ctx) // after the guard ran: with its once record
			if err != nil {
				return nil, err
			}
			s.stash(k.orderID, pending, reply)
			return nil, nil // nothing sent now
		case actDuplicate:
			reply, err := next(ctx, tx, cmd)
			if err != nil || reply == nil {
				return reply, err
			}
			// The effect is applied once; the reply goes out a second
			// time with a new id.
			env, ok := participant.Command(ctx)
			if !ok {
				return nil, errors.New("script: duplicate reply outside a command's handling")
			}
			dup, err := participant.ReplyEnvelope(env, reply)
			if err != nil {
				return nil, err
			}
			if err := outbox.Enqueue(ctx, tx, dup); err != nil {
				return nil, fmt.Errorf("script: enqueue duplicate reply to %s %s: %w", env.MessageType, env.MessageID, err)
			}
			return reply, nil
		}
		return next(ctx, tx, cmd)
	}
}

// SendHeldReply sends the oldest reply held for orderID, in a transaction of
// its own, as the participant would when it answers late
// (participant.ReplyLater: causation = the command it answers). It reports
// false when no reply is held.
func (s *Script) SendHeldReply(ctx context.Context, pool *pgxpool.Pool, orderID string) (bool, error) {
	h, ok := s.take(orderID)
	if !ok {
		return false, nil
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return participant.ReplyLater(ctx, tx, h.command, h.command.Command, h.reply)
	})
	if err != nil {
		s.putBack(orderID, h)
		return false, fmt.Errorf("send held reply for order %s: %w", orderID, err)
	}
	return true, nil
}
