package app

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
)

// Fault kinds, as Faults.Observe reports them.
const (
	FaultTransient = "transient"  // a delivery failed before any effect
	FaultSlow      = "slow"       // a reply was held back, to be sent after SlowDelay
	FaultSlowSent  = "slow-sent"  // a held-back reply was sent
	FaultDuplicate = "duplicate"  // a command was answered twice
	FaultSlowStale = "slow-stale" // a held-back reply whose effect never committed was dropped
)

// Faults injects random participant faults for chaos runs. Every decision
// is a seeded hash of the delivery (message id, attempt), not a random draw,
// so every process of a fleet decides the same way for the same delivery and
// a run with the same seed injects the same faults into the same messages.
//
// Business failures need no fault: they come from the data (a product
// without stock, DeclinedCard).
type Faults struct {
	// Seed varies the decisions between runs.
	Seed uint64
	// Transient is the probability that a delivery fails with a transient
	// error before any effect; the consumer retries it through its tiers
	// and parks it when the retry budget is spent.
	Transient float64
	// Slow is the probability that a command's reply is held back: the
	// effect commits with the delivery, and the reply is sent SlowDelay
	// later in a transaction of its own, which is past the step's timeout
	// when SlowDelay exceeds it. A reply still held when the process dies
	// is lost, as a crashed participant's would be.
	Slow      float64
	SlowDelay time.Duration
	// Duplicate is the probability that a command is answered twice, by
	// two reply messages with different ids.
	Duplicate float64
	// Observe, when set, is told about every injected fault (Fault* kinds).
	Observe func(kind string)
}

func (f *Faults) observe(kind string) {
	if f.Observe != nil {
		f.Observe(kind)
	}
}

// roll returns a number in [0, 1) determined by the seed and the parts.
func (f *Faults) roll(parts ...string) float64 {
	h := fnv.New64a()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], f.Seed)
	_, _ = h.Write(seed[:])
	for _, p := range parts {
		_, _ = h.Write([]byte(p))
		_, _ = h.Write([]byte{0})
	}
	return float64(h.Sum64()>>11) / float64(1<<53)
}

// faulty wraps a participant's generated handler with random faults. It runs
// inside Script's wrapper when both are configured.
func (a *App) faulty(h consumer.HandlerFunc) consumer.HandlerFunc {
	f := a.cfg.Faults
	if f == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		id := d.Envelope.MessageID
		if f.roll(id, fmt.Sprint(d.Attempt), "transient") < f.Transient {
			f.observe(FaultTransient)
			return failure.Transient(fmt.Errorf("injected transient failure of %s %s (attempt %d)",
				d.Envelope.MessageType, id, d.Attempt))
		}
		if f.roll(id, "slow") < f.Slow {
			reply, err := a.answer(ctx, tx, d)
			if err != nil {
				return err
			}
			f.observe(FaultSlow)
			a.slow.hold(d.Queue, d.Envelope, reply, f.SlowDelay)
			return nil
		}
		if err := h(ctx, tx, d); err != nil {
			return err
		}
		if f.roll(id, "duplicate") < f.Duplicate {
			// The effect is applied once; participant.Idempotent replays its
			// reply, which goes out a second time with a new id.
			reply, err := a.answer(ctx, tx, d)
			if err != nil {
				return err
			}
			f.observe(FaultDuplicate)
			return sendReply(ctx, tx, &d.Envelope, reply)
		}
		return nil
	}
}

// slowReplies sends held-back replies after their delay, each in a
// transaction of its own, and only when the command's delivery committed.
type slowReplies struct {
	mu      sync.Mutex
	pending []slowReply
	wake    chan struct{}
}

type slowReply struct {
	queue   string // the consumer (inbox) name of the command's delivery
	command envelope.Envelope
	reply   message.Message
	due     time.Time
}

func newSlowReplies() *slowReplies { return &slowReplies{wake: make(chan struct{}, 1)} }

func (s *slowReplies) hold(queue string, cmd envelope.Envelope, reply message.Message, delay time.Duration) {
	s.mu.Lock()
	s.pending = append(s.pending, slowReply{queue: queue, command: cmd, reply: reply, due: time.Now().Add(delay)})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// due removes and returns the replies due at now, and the next due time.
func (s *slowReplies) due(now time.Time) ([]slowReply, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out, keep []slowReply
	var next time.Time
	for _, r := range s.pending {
		if !r.due.After(now) {
			out = append(out, r)
			continue
		}
		keep = append(keep, r)
		if next.IsZero() || r.due.Before(next) {
			next = r.due
		}
	}
	s.pending = keep
	return out, next
}

// run sends held-back replies until ctx is done. Replies still held then are
// dropped: lost, like a crashed participant's.
func (a *App) runSlowReplies(ctx context.Context) error {
	s := a.slow
	for {
		ready, next := s.due(time.Now())
		for _, r := range ready {
			if err := a.sendSlow(ctx, r); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				a.cfg.Logger.Warn("held-back reply not sent; retrying", "command_id", r.command.MessageID, "error", err)
				r.due = time.Now().Add(time.Second)
				s.mu.Lock()
				s.pending = append(s.pending, r)
				s.mu.Unlock()
				if next.IsZero() || r.due.Before(next) {
					next = r.due
				}
			}
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// slowReplyNamespace derives held-back replies' message ids from their
// commands', so that two processes holding the same command's reply (a
// delivery handled, rolled back with its batch, and handled again) send it
// once: the outbox's unique message id refuses the second.
var slowReplyNamespace = uuid.MustParse("6f1d3c2e-4b7a-4c55-9a7e-2f0b8d9e1c40")

func (a *App) sendSlow(ctx context.Context, r slowReply) error {
	env, err := participant.ReplyEnvelope(&r.command, r.reply)
	if err != nil {
		return err
	}
	env.MessageID = uuid.NewSHA1(slowReplyNamespace, []byte(r.command.MessageID)).String()
	sent := false
	err = pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		var committed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM saga_inbox WHERE consumer = $1 AND message_id = $2)`,
			r.queue, r.command.MessageID).Scan(&committed); err != nil {
			return fmt.Errorf("check delivery of %s: %w", r.command.MessageID, err)
		}
		if !committed {
			return nil // the effect was rolled back; the redelivery answers
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT slow_reply"); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		if err := outbox.Enqueue(ctx, tx, env); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				_, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT slow_reply")
				return rerr // already sent by another holder
			}
			return err
		}
		sent = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("send held-back reply to %s %s: %w", r.command.MessageType, r.command.MessageID, err)
	}
	if sent {
		a.cfg.Faults.observe(FaultSlowSent)
	} else {
		a.cfg.Faults.observe(FaultSlowStale)
	}
	return nil
}
