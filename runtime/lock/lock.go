package lock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/protosaga/saga/runtime/telemetry"
)

// ErrHeld is matched by the error of [Locker.TryAcquire] (and of a
// [Backend]'s TryAcquire) when another owner holds the lease.
var ErrHeld = errors.New("lock is held by another owner")

// ErrLost is matched by the error of [Lease.Extend] and [Lease.Release] (and
// of a [Backend]'s) when the caller no longer holds the lease: it expired,
// another owner took it, or the backend forgot it (a Redis restart without
// persistence).
var ErrLost = errors.New("lease lost")

// Backend stores leases. Implementations must make TryAcquire, Extend and
// Release atomic on the backend, and hand out fencing tokens that only grow
// per name.
type Backend interface {
	// Name identifies the implementation in metrics and errors
	// ("postgres", "redis").
	Name() string
	// TryAcquire takes the lease on name for owner for ttl, and returns
	// its fencing token, when nobody else holds it; it returns an error
	// matching ErrHeld when somebody else does. A call for a name the same
	// owner holds takes it again with a new token (a retry after a lost
	// reply).
	TryAcquire(ctx context.Context, name, owner string, ttl time.Duration) (token int64, err error)
	// Extend sets the lease's expiry to ttl from now while owner holds it
	// with token; otherwise it returns an error matching ErrLost.
	Extend(ctx context.Context, name, owner string, token int64, ttl time.Duration) error
	// Release ends the lease while owner holds it with token; otherwise
	// (expired, taken, forgotten) it returns an error matching ErrLost and
	// leaves any other owner's lease alone.
	Release(ctx context.Context, name, owner string, token int64) error
}

// Config configures a [Locker].
type Config struct {
	// TTL is the lease time of Acquire and TryAcquire calls that pass 0
	// (default 30 s). Choose it longer than the work under the lease takes,
	// with margin; extend leases of longer work.
	TTL time.Duration
	// RetryMin and RetryMax bound the pause between attempts of a waiting
	// Acquire: it starts at RetryMin and doubles up to RetryMax, with
	// jitter (defaults 10 ms and 500 ms).
	RetryMin, RetryMax time.Duration
	// OwnerPrefix starts every owner token (a host or process name helps
	// an operator reading saga_locks); a random part follows.
	OwnerPrefix string
	// Telemetry records lock wait and hold metrics; the zero value records
	// nothing.
	Telemetry telemetry.Providers
	// Now is the clock of the lease's local deadline and of the metrics
	// (default time.Now).
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = 30 * time.Second
	}
	if c.RetryMin == 0 {
		c.RetryMin = 10 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 500 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.TTL < 0:
		return fmt.Errorf("lock config: negative TTL %s", c.TTL)
	case c.RetryMin < 0 || c.RetryMax < 0:
		return fmt.Errorf("lock config: negative retry pause (min %s, max %s)", c.RetryMin, c.RetryMax)
	case c.RetryMax != 0 && c.RetryMin > c.RetryMax:
		return fmt.Errorf("lock config: RetryMin %s above RetryMax %s", c.RetryMin, c.RetryMax)
	}
	return nil
}

// Locker hands out leases from one [Backend]. It is safe for concurrent use.
type Locker struct {
	b       Backend
	cfg     Config
	metrics *telemetry.LockMetrics
}

// New returns a Locker on b.
func New(b Backend, cfg Config) (*Locker, error) {
	if b == nil {
		return nil, errors.New("lock: nil backend")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	m, err := telemetry.NewLockMetrics(cfg.Telemetry)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	return &Locker{b: b, cfg: cfg, metrics: m}, nil
}

// Backend returns the Locker's backend.
func (l *Locker) Backend() Backend { return l.b }

func (l *Locker) owner() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	if l.cfg.OwnerPrefix == "" {
		return hex.EncodeToString(b[:])
	}
	return l.cfg.OwnerPrefix + ":" + hex.EncodeToString(b[:])
}

// TryAcquire takes the lease on name for ttl (Config.TTL when 0) once: it
// returns an error matching [ErrHeld] at once when another owner holds it.
func (l *Locker) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	ttl, err := l.check(name, ttl)
	if err != nil {
		return nil, err
	}
	start := l.cfg.Now()
	lease, err := l.try(ctx, name, l.owner(), ttl, start)
	l.metrics.Waited(ctx, l.b.Name(), waitOutcome(ctx, err), l.cfg.Now().Sub(start))
	if err != nil {
		return nil, fmt.Errorf("try lock %q (%s): %w", name, l.b.Name(), err)
	}
	return lease, nil
}

// Acquire takes the lease on name for ttl (Config.TTL when 0), waiting while
// another owner holds it and retrying failed attempts (a lost connection),
// until ctx ends. Its error then wraps ctx's error and says what the last
// attempt found.
func (l *Locker) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	ttl, err := l.check(name, ttl)
	if err != nil {
		return nil, err
	}
	start := l.cfg.Now()
	owner := l.owner() // one owner for every attempt: a retry after a lost reply takes its own lease back
	pause := l.cfg.RetryMin
	var last error // of the last attempt that ctx's end did not cut short
	for attempt := 1; ; attempt++ {
		lease, err := l.try(ctx, name, owner, ttl, l.cfg.Now())
		if err == nil {
			l.metrics.Waited(ctx, l.b.Name(), telemetry.LockAcquired, l.cfg.Now().Sub(start))
			return lease, nil
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		if ctx.Err() == nil {
			d := pause/2 + rand.N(pause/2+1)
			pause = min(pause*2, l.cfg.RetryMax)
			t := time.NewTimer(d)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		l.metrics.Waited(ctx, l.b.Name(), telemetry.LockCanceled, l.cfg.Now().Sub(start))
		return nil, fmt.Errorf("acquire lock %q (%s) after %d attempt(s): %w (last attempt: %w)", name, l.b.Name(), attempt, ctx.Err(), last)
	}
}

// Do runs fn under the lease on name (waiting for it like Acquire) and
// releases it when fn returns. fn's context ends at the lease's local
// deadline as it was when fn started (an Extend inside fn does not move it:
// use Acquire for work that extends its lease); fn must still pass
// lease.Token to the resource it writes, which is what protects it when fn
// overruns. Do returns fn's error, or the
// release's error (matching [ErrLost] when the lease ran out under fn).
func (l *Locker) Do(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, lease *Lease) error) error {
	lease, err := l.Acquire(ctx, name, ttl)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithDeadline(ctx, lease.Deadline())
	ferr := fn(fctx, lease)
	cancel()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	rerr := lease.Release(rctx)
	if ferr != nil {
		return ferr
	}
	return rerr
}

// check validates a request and returns its lease time.
func (l *Locker) check(name string, ttl time.Duration) (time.Duration, error) {
	if ttl == 0 {
		ttl = l.cfg.TTL
	}
	switch {
	case name == "":
		return 0, errors.New("lock: empty lock name")
	case ttl < time.Millisecond:
		return 0, fmt.Errorf("lock %q: lease time %s below 1ms", name, ttl)
	}
	return ttl, nil
}

// try makes one attempt; start is when it was sent.
func (l *Locker) try(ctx context.Context, name, owner string, ttl time.Duration, start time.Time) (*Lease, error) {
	token, err := l.b.TryAcquire(ctx, name, owner, ttl)
	if err != nil {
		return nil, err
	}
	now := l.cfg.Now()
	return &Lease{Name: name, Owner: owner, Token: token, l: l, acquired: now, deadline: start.Add(ttl)}, nil
}

func waitOutcome(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return telemetry.LockAcquired
	case errors.Is(err, ErrHeld):
		return telemetry.LockHeld
	case ctx.Err() != nil:
		return telemetry.LockCanceled
	default:
		return telemetry.LockError
	}
}

// Lease is a held lock. Its methods are safe for concurrent use.
type Lease struct {
	// Name is the lock's name.
	Name string
	// Owner is this lease's owner token, unique per lease.
	Owner string
	// Token is the fencing token: pass it to the resource with every
	// write made under the lease.
	Token int64

	l        *Locker
	acquired time.Time

	mu       sync.Mutex
	deadline time.Time
	ended    bool
}

// Deadline is when the lease expires at the latest, by the local clock: the
// time its request was sent plus its lease time. The backend may expire it
// earlier only if the clocks drift apart.
func (x *Lease) Deadline() time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.deadline
}

// Valid reports whether the lease has neither ended nor passed its local
// deadline. It is a hint for long work (stop early), not a guarantee: a
// pause right after it returns true can outlast the lease. The fencing
// token is the guarantee.
func (x *Lease) Valid() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return !x.ended && x.l.cfg.Now().Before(x.deadline)
}

// Extend sets the lease to expire ttl (Config.TTL when 0) from now, while
// it is still held. It returns an error matching [ErrLost] when it is not:
// the work under it must stop, its writes will be refused.
func (x *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl == 0 {
		ttl = x.l.cfg.TTL
	}
	start := x.l.cfg.Now()
	err := x.l.b.Extend(ctx, x.Name, x.Owner, x.Token, ttl)
	if errors.Is(err, ErrLost) {
		x.end(ctx, telemetry.LockLost)
	}
	if err != nil {
		return fmt.Errorf("extend lock %q token %d (%s): %w", x.Name, x.Token, x.l.b.Name(), err)
	}
	x.mu.Lock()
	x.deadline = start.Add(ttl)
	x.mu.Unlock()
	return nil
}

// Release ends the lease. It returns an error matching [ErrLost] when the
// lease had already expired or been taken (then it changes nothing another
// owner holds): whatever ran under it may have overlapped with the next
// owner, and only fenced writes were protected.
func (x *Lease) Release(ctx context.Context) error {
	err := x.l.b.Release(ctx, x.Name, x.Owner, x.Token)
	switch {
	case err == nil:
		x.end(ctx, telemetry.LockReleased)
	case errors.Is(err, ErrLost):
		x.end(ctx, telemetry.LockLost)
	}
	if err != nil {
		return fmt.Errorf("release lock %q token %d (%s): %w", x.Name, x.Token, x.l.b.Name(), err)
	}
	return nil
}

// end records the hold once.
func (x *Lease) end(ctx context.Context, outcome string) {
	x.mu.Lock()
	ended := x.ended
	x.ended = true
	x.mu.Unlock()
	if !ended {
		x.l.metrics.Held(ctx, x.l.b.Name(), outcome, x.l.cfg.Now().Sub(x.acquired))
	}
}
