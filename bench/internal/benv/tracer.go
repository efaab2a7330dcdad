package benv

import (
	"context"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// StatementCounter is a pgx.QueryTracer that counts the statements (round
// trips of one query each: BEGIN, SAVEPOINT and COMMIT included) a pool
// sends, in total and by statement text.
type StatementCounter struct {
	total atomic.Int64
	mu    sync.Mutex
	by    map[string]int64
}

// TraceQueryStart counts one statement.
func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.total.Add(1)
	// The key is the statement's first 70 characters with whitespace
	// collapsed; normalizing only its head keeps the tracer's own CPU, which
	// counts as the measured process's, small for long batch statements.
	sql := data.SQL
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
	return ctx
}

// TraceQueryEnd does nothing.
func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Total is how many statements were counted.
func (c *StatementCounter) Total() int64 { return c.total.Load() }

// Reset forgets every count.
func (c *StatementCounter) Reset() {
	c.mu.Lock()
	c.by = nil
	c.total.Store(0)
	c.mu.Unlock()
}

// StatementCount is one statement text and how often it ran.
type StatementCount struct {
	SQL   string
	Count int64
}

// Top returns the n most frequent statements.
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
