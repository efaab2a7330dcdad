package benv

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// StatementCounter counts the statements PostgreSQL executes for one pool
// (Schema.Pool installs it): Total and ByCommand count the server's
// CommandComplete answers on the pool's connections, so statements sent in
// pgx batches, pgconn pipelines and multi-statement queries count once each,
// BEGIN and COMMIT included. When the run traces statement text
// (Env.TraceStatementText), it also keeps how often each statement text was
// sent through pgx's query and batch paths, for Top.
type StatementCounter struct {
	wire wireCounts
	mu   sync.Mutex
	by   map[string]int64
}

// Total is how many statements the server executed.
func (c *StatementCounter) Total() int64 { return c.wire.total() }

// RoundTrips is how many times the pool's connections wrote to the server
// after reading an answer: round trips, however many statements each
// carried.
func (c *StatementCounter) RoundTrips() int64 { return c.wire.roundTrips.Load() }

// Failed is how many statements the server answered with an error.
func (c *StatementCounter) Failed() int64 { return c.wire.errors.Load() }

// ByCommand is how many statements of each kind in Commands the server
// executed, in the order of Commands.
func (c *StatementCounter) ByCommand() []int64 {
	out := make([]int64, len(Commands))
	for i := range out {
		out[i] = c.wire.byCommand[i].Load()
	}
	return out
}

// Reset forgets every count.
func (c *StatementCounter) Reset() {
	c.mu.Lock()
	c.by = nil
	c.wire.reset()
	c.mu.Unlock()
}

// TraceQueryStart records the text of one statement sent on its own.
func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.text(data.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart does nothing.
func (c *StatementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery records the text of one statement of a batch.
func (c *StatementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.text(data.SQL)
}

// TraceBatchEnd does nothing.
func (c *StatementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// text counts one statement under its first 70 characters with whitespace
// collapsed.
func (c *StatementCounter) text(sql string) {
	if len(sql) > 256 {
		sql = sql[:256]
	}
	key := strings.Join(strings.Fields(sql), " ")
	if len(key) > 70 {
		key = key[:70]
	}
	c.mu.Lock()
	if c.by == nil {
		c.by = map[string]int64{}
	}
	c.by[key]++
	c.mu.Unlock()
}

// StatementCount is one statement text and how often it was sent.
type StatementCount struct {
	SQL   string
	Count int64
}

// Top returns the n statement texts sent most often (empty unless the run
// traces statement text). pgconn pipelines bypass pgx's tracers, so their
// statements are in Total but not here.
func (c *StatementCounter) Top(n int) []StatementCount {
	c.mu.Lock()
	out := make([]StatementCount, 0, len(c.by))
	for k, v := range c.by {
		out = append(out, StatementCount{k, v})
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	if len(out) > n {
		out = out[:n]
	}
	return out
}
