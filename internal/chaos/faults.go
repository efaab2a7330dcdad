package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// Fault kinds, as Faults.Observe reports them.
const (
	FaultTransient = "transient"  // a delivery failed before any effect
	FaultSlow      = "slow"       // a reply was held back, to be sent after SlowDelay
	FaultSlowSent  = "slow-sent"  // a held-back reply was sent
	FaultDuplicate = "duplicate"  // a command was answered twice
	FaultSlowStale = "slow-stale" // a held-back reply whose effect never committed was dropped
)

// Faults are the random participant faults a node injects. Every decision is a seeded hash
// of the delivery (message id, attempt), not a random draw, so every process
// of a fleet decides the same way for the same delivery and a run with the
// same seed injects the same faults into the same messages. It is a
// participant middleware (host.Config.ParticipantMiddleware), outside the
// once-per-command guard, so a held or duplicated reply is the one the guard
// stored.
//
// Business failures need no fault: they come from the data (a product
// without stock, app.DeclinedCard).
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

// injector applies Faults in one node: its middleware, and the held-back
// replies it sends later.
type injector struct {
	Faults
	slow slowReplies
}

func newInjector(f Faults) *injector {
	return &injector{Faults: f, slow: slowReplies{wake: make(chan struct{}, 1)}}
}

// Validate reports probabilities outside [0, 1] and slow replies without a
// delay.
func (f *Faults) Validate() error {
	var errs []error
	for name, p := range map[string]float64{"transient": f.Transient, "slow": f.Slow, "duplicate": f.Duplicate} {
		if p < 0 || p > 1 {
			errs = append(errs, fmt.Errorf("fault probability %s = %v: want [0, 1]", name, p))
		}
	}
	if f.Slow > 0 && f.SlowDelay <= 0 {
		errs = append(errs, errors.New("slow replies need a positive SlowDelay"))
	}
	return errors.Join(errs...)
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

// Middleware injects the faults around one participant.
func (f *injector) Middleware(service string, next participant.Func) participant.Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		env, ok := participant.Command(ctx)
		if !ok {
			return nil, errors.New("faults: a command without its envelope")
		}
		id := env.MessageID
		attempt := int64(1)
		if n, ok, err := message.HeaderInt(env.Headers, message.HeaderAttempt); ok && err == nil && n > 1 {
			attempt = n
		}
		if f.roll(id, strconv.FormatInt(attempt, 10), "transient") < f.Transient {
			f.observe(FaultTransient)
			return nil, retry.Transient(fmt.Errorf("injected transient failure of %s %s (attempt %d)", env.MessageType, id, attempt))
		}
		if f.roll(id, "slow") < f.Slow {
			reply, err := next(ctx, tx, cmd)
			if err != nil || reply == nil {
				return nil, err
			}
			pending, err := participant.Later(ctx) // after the guard ran: with its once record
			if err != nil {
				return nil, err
			}
			f.observe(FaultSlow)
			f.slow.hold(pending, reply, f.SlowDelay)
			return nil, nil
		}
		reply, err := next(ctx, tx, cmd)
		if err != nil || reply == nil {
			return reply, err
		}
		if f.roll(id, "duplicate") < f.Duplicate {
			// The effect is applied once; the reply the guard stored goes
			// out a second time with a new id.
			dup, err := participant.ReplyEnvelope(env, reply)
			if err != nil {
				return nil, err
			}
			// The guard's own resend of a stored reply says that the
			// command ran once; so does this copy of it.
			if dup.Headers == nil {
				dup.Headers = map[string]any{}
			}
			dup.Headers[message.HeaderOnce] = service
			if err := outbox.Enqueue(ctx, tx, dup); err != nil {
				return nil, fmt.Errorf("faults: enqueue duplicate reply to %s %s: %w", env.MessageType, id, err)
			}
			f.observe(FaultDuplicate)
		}
		return reply, nil
	}
}

// slowReplies holds back replies and sends them after their delay, each in
// a transaction of its own, and only when the command's effect committed.
type slowReplies struct {
	mu      sync.Mutex
	pending []slowReply
	wake    chan struct{}
}

type slowReply struct {
	command participant.Pending
	reply   message.Message
	due     time.Time
}

func (s *slowReplies) hold(cmd participant.Pending, reply message.Message, delay time.Duration) {
	s.mu.Lock()
	s.pending = append(s.pending, slowReply{command: cmd, reply: reply, due: time.Now().Add(delay)})
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

// runSlowReplies sends held-back replies until ctx is done. Replies still
// held then are dropped: lost, like a crashed participant's.
func (f *injector) runSlowReplies(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	s := &f.slow
	wake := s.wake
	for {
		ready, next := s.due(time.Now())
		for _, r := range ready {
			if err := f.sendSlow(ctx, pool, r); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				logger.Warn("held-back reply not sent; retrying", "command_id", r.command.MessageID, "error", err)
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
		case <-wake:
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

func (f *injector) sendSlow(ctx context.Context, pool *pgxpool.Pool, r slowReply) error {
	p := r.command
	if p.Service == "" || p.OnceKey == "" {
		return fmt.Errorf("held-back reply to %s %s: the command's once record is unknown", p.Command, p.MessageID)
	}
	env, err := participant.ReplyEnvelope(p.Envelope(), r.reply)
	if err != nil {
		return err
	}
	env.MessageID = uuid.NewSHA1(slowReplyNamespace, []byte(p.MessageID)).String()
	// The command ran under the once-per-command guard, whose record is
	// checked below: the reply says so, as participant.ReplyLater's does.
	if env.Headers == nil {
		env.Headers = map[string]any{}
	}
	env.Headers[message.HeaderOnce] = p.Service
	sent := false
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The guard's once record commits with the effect.
		var committed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM saga_participant_once WHERE service = $1 AND idempotency_key = $2)`,
			p.Service, p.OnceKey).Scan(&committed); err != nil {
			return fmt.Errorf("check the effect of %s: %w", p.MessageID, err)
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
		return fmt.Errorf("send held-back reply to %s %s: %w", p.Command, p.MessageID, err)
	}
	if sent {
		f.observe(FaultSlowSent)
	} else {
		f.observe(FaultSlowStale)
	}
	return nil
}
