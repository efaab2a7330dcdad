package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	travelapp "github.com/protosaga/saga/examples/travel/app"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
)

// CrashPoint names a moment in a message's path at which the soak stops a
// node, to prove that the moment is safe to die at.
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
	// CrashMidCompensation: a participant applied a compensation inside its
	// consumer's transaction, which is not committed. The compensation is
	// rolled back with the process and applied again, once, on redelivery.
	CrashMidCompensation CrashPoint = "mid-compensation"
	// CrashCompensationCommitted: a batch holding a compensation committed and
	// is not acknowledged.
	CrashCompensationCommitted CrashPoint = "compensation-after-commit"
)

// CrashPoints lists every crash point.
func CrashPoints() []CrashPoint {
	return []CrashPoint{CrashAfterCommit, CrashAfterPublish, CrashMidCompensation, CrashCompensationCommitted}
}

// Crashes arms crash points in one node: the n-th time the node passes an
// armed point, At is called on the goroutine standing at that point (and the
// point is disarmed). A node's At announces the point and blocks until the
// driver kills the process with SIGKILL, so the process dies exactly there.
//
// The runtime has no hooks for its points, and needs none: Crashes sees them
// through the database driver (Tracer, the pool's pgx QueryTracer) — a
// relay's mark statement, sent only after the broker confirmed the batch,
// and the COMMIT of a transaction that claimed inbox rows (a consumer's
// batch; it acknowledges only after the COMMIT returns) — and the
// compensations through a participant middleware (Middleware).
type Crashes struct {
	at func(CrashPoint)

	mu       sync.Mutex
	armed    map[CrashPoint]int     // passages left before the point fires
	consumer map[*pgx.Conn]bool     // connections whose open transaction claimed inbox rows
	returned map[*pgx.Conn]bool     // connections whose open transaction returned stock (a release's effect)
	marked   map[*pgx.Conn]struct{} // connections whose open transaction holds a compensation
}

// NewCrashes returns crash points armed as in arm (point → which passage
// fires it, 1 = the first); at is called when one fires.
func NewCrashes(at func(CrashPoint), arm map[CrashPoint]int) *Crashes {
	c := &Crashes{at: at, armed: map[CrashPoint]int{}, consumer: map[*pgx.Conn]bool{}, returned: map[*pgx.Conn]bool{},
		marked: map[*pgx.Conn]struct{}{}}
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

// returnStockSQL is in the statement by which the inventory's release gives
// stock back: the compensation's effect. The travel example's cancellations
// give a unit back by a statement holding travelapp.ReleaseHoldSQL.
const returnStockSQL = "SET available = s.available + x.q"

// Middleware stops a participant that has just applied a compensation —
// given stock, a seat, a room or a car back — in its uncommitted
// transaction (CrashMidCompensation), and marks the transaction for
// CrashCompensationCommitted. A compensation that found nothing to undo,
// or was answered from its stored reply, passes neither.
func (c *Crashes) Middleware(_ string, next participant.Func) participant.Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		reply, err := next(ctx, tx, cmd)
		if err != nil {
			return reply, err
		}
		c.mu.Lock()
		returned := c.returned[tx.Conn()]
		delete(c.returned, tx.Conn())
		if returned {
			c.marked[tx.Conn()] = struct{}{}
		}
		c.mu.Unlock()
		if returned {
			c.pass(CrashMidCompensation)
		}
		return reply, nil
	}
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

// TraceQueryStart stops a relay before it marks a published batch and notes
// transactions that claim inbox rows or read participants' once records
// (consumers' batches).
func (t crashTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := strings.TrimSpace(data.SQL)
	switch {
	case strings.EqualFold(sql, "commit"):
		return context.WithValue(ctx, stmtKey{}, stmtCommit)
	case strings.EqualFold(sql, "rollback"):
		return context.WithValue(ctx, stmtKey{}, stmtRollback)
	case strings.Contains(sql, "INSERT INTO saga_outbox_sent"):
		t.c.pass(CrashAfterPublish)
	case consumerBatchSQL(sql):
		t.c.mu.Lock()
		t.c.consumer[conn] = true
		t.c.mu.Unlock()
	case strings.Contains(sql, returnStockSQL), strings.Contains(sql, travelapp.ReleaseHoldSQL):
		t.c.mu.Lock()
		t.c.returned[conn] = true
		t.c.mu.Unlock()
	}
	return ctx
}

// consumerBatchSQL reports whether sql is one only a consumer's batch
// transaction runs: an inbox claim, the saga engine's read of which
// unclaimed deliveries the inbox names, or a participant's read of its once
// records.
func consumerBatchSQL(sql string) bool {
	return strings.Contains(sql, "INTO saga_inbox") || strings.Contains(sql, "FROM saga_inbox WHERE consumer") ||
		strings.Contains(sql, "reply_body FROM saga_participant_once")
}

// TraceBatchStart implements pgx.BatchTracer: statements sent in a batch
// (the saga engine's batch lock with its inbox read) are noted like single
// ones.
func (t crashTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery notes a consumer's batch transaction by a statement it sent
// in a batch.
func (t crashTracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if consumerBatchSQL(data.SQL) {
		t.c.mu.Lock()
		t.c.consumer[conn] = true
		t.c.mu.Unlock()
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t crashTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceQueryEnd stops a consumer after its batch committed, before the
// acknowledgement.
func (t crashTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	kind, _ := ctx.Value(stmtKey{}).(stmtKind)
	if kind == stmtOther {
		return
	}
	t.c.mu.Lock()
	_, marked := t.c.marked[conn]
	consumer := t.c.consumer[conn]
	delete(t.c.marked, conn)
	delete(t.c.consumer, conn)
	delete(t.c.returned, conn)
	t.c.mu.Unlock()
	if kind != stmtCommit || data.Err != nil || data.CommandTag.String() != "COMMIT" || !consumer {
		return
	}
	if marked {
		t.c.pass(CrashCompensationCommitted)
	}
	t.c.pass(CrashAfterCommit)
}
