package app

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// CrashPoint names a moment in a message's path at which a chaos test stops
// a process, to prove that the moment is safe to die at.
type CrashPoint string

// The crash points.
const (
	// CrashAfterCommit: a consumer's batch transaction committed (inbox
	// claims, effects, outbox rows) and nothing of it is acknowledged yet.
	// The broker redelivers the batch; the inbox makes it a no-op.
	CrashAfterCommit CrashPoint = "after-commit-before-ack"
	// CrashAfterPublish: a relay's batch was published and confirmed by the
	// broker and is not yet marked published. The rows are published again
	// once their lease runs out, with the same message ids; consumers' inboxes
	// absorb the copies.
	CrashAfterPublish CrashPoint = "after-publish-before-mark"
	// CrashMidCompensation: the inventory service applied a compensation
	// (ReleaseInventory) inside its consumer's transaction, which is not
	// committed. The release is rolled back with the process and applied
	// again, once, on redelivery.
	CrashMidCompensation CrashPoint = "mid-compensation"
	// CrashCompensationCommitted: a batch holding a compensation committed and
	// is not acknowledged.
	CrashCompensationCommitted CrashPoint = "compensation-after-commit"
)

// CrashPoints lists every crash point.
func CrashPoints() []CrashPoint {
	return []CrashPoint{CrashAfterCommit, CrashAfterPublish, CrashMidCompensation, CrashCompensationCommitted}
}

// Crashes arms crash points in one process: the n-th time the process passes
// an armed point, At is called on the goroutine standing at that point (and
// the point is disarmed). A chaos node's At announces the point and blocks
// until the driver kills the process with SIGKILL, so the process dies
// exactly there.
//
// The consumer and relay points live inside the runtime, which has no hooks
// for them: Crashes sees them through the database driver. Install
// Crashes.Tracer as the pgx QueryTracer of the pool given to Config.Pool; it
// recognizes a consumer's COMMIT (the consumer acknowledges only after it
// returns) and a relay's mark statement (sent only after the broker
// confirmed the batch) by the part of the application whose context carries
// the call.
type Crashes struct {
	at func(CrashPoint)

	mu     sync.Mutex
	armed  map[CrashPoint]int       // passages left before the point fires
	marked map[*pgx.Conn]CrashPoint // connections whose open transaction holds a compensation
}

// NewCrashes returns crash points armed as in arm (point → which passage
// fires it, 1 = the first); at is called when one fires.
func NewCrashes(at func(CrashPoint), arm map[CrashPoint]int) *Crashes {
	c := &Crashes{at: at, armed: map[CrashPoint]int{}, marked: map[*pgx.Conn]CrashPoint{}}
	for p, n := range arm {
		if n > 0 {
			c.armed[p] = n
		}
	}
	return c
}

// ParseCrashArm parses "point:n,point:n" (n defaults to 1) into an arming
// map for NewCrashes.
func ParseCrashArm(s string) (map[CrashPoint]int, error) {
	out := map[CrashPoint]int{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, count, found := strings.Cut(part, ":")
		n := 1
		if found {
			v, err := strconv.Atoi(count)
			if err != nil || v < 1 {
				return nil, fmt.Errorf("crash point %q: passage %q is not a positive integer", name, count)
			}
			n = v
		}
		p := CrashPoint(name)
		known := false
		for _, k := range CrashPoints() {
			known = known || k == p
		}
		if !known {
			return nil, fmt.Errorf("unknown crash point %q (want one of %v)", name, CrashPoints())
		}
		out[p] = n
	}
	return out, nil
}

// Armed reports whether any point is still armed.
func (c *Crashes) Armed() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.armed) > 0
}

// pass records one passage of p and calls At when it is the armed one.
func (c *Crashes) pass(p CrashPoint) {
	if c == nil {
		return
	}
	c.mu.Lock()
	n, ok := c.armed[p]
	if ok {
		n--
		if n <= 0 {
			delete(c.armed, p)
		} else {
			c.armed[p] = n
		}
	}
	c.mu.Unlock()
	if ok && n <= 0 && c.at != nil {
		c.at(p)
	}
}

// markCompensation records that the transaction open on conn applied a
// compensation, for CrashCompensationCommitted.
func (c *Crashes) markCompensation(tx pgx.Tx) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marked[tx.Conn()] = CrashCompensationCommitted
}

// Tracer returns the pgx QueryTracer that detects the runtime's crash points.
func (c *Crashes) Tracer() pgx.QueryTracer { return crashTracer{c} }

type crashTracer struct{ c *Crashes }

type stmtKey struct{}

type stmtKind int

const (
	stmtOther stmtKind = iota
	stmtCommit
	stmtRollback
)

// TraceQueryStart stops the relay before it marks a published batch.
func (t crashTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := strings.TrimSpace(data.SQL)
	switch {
	case strings.EqualFold(sql, "commit"):
		return context.WithValue(ctx, stmtKey{}, stmtCommit)
	case strings.EqualFold(sql, "rollback"):
		return context.WithValue(ctx, stmtKey{}, stmtRollback)
	case partOf(ctx) == partRelay && strings.Contains(sql, "INSERT INTO saga_outbox_sent"):
		t.c.pass(CrashAfterPublish)
	}
	return ctx
}

// TraceQueryEnd stops a consumer after its batch committed, before the
// acknowledgement.
func (t crashTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	kind, _ := ctx.Value(stmtKey{}).(stmtKind)
	if kind == stmtOther {
		return
	}
	t.c.mu.Lock()
	mark, marked := t.c.marked[conn]
	delete(t.c.marked, conn)
	t.c.mu.Unlock()
	if kind != stmtCommit || data.Err != nil || data.CommandTag.String() != "COMMIT" || partOf(ctx) != partConsumer {
		return
	}
	if marked {
		t.c.pass(mark)
	}
	t.c.pass(CrashAfterCommit)
}
