package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/schema"
)

// waitLeased waits until at least want unpublished rows are leased, so the
// pipeline behind a held batch has filled up.
func waitLeased(ctx context.Context, pool *pgxpool.Pool, want int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM saga_outbox_pending WHERE lease_until > now()").Scan(&n); err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d rows leased, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pipelineDepth is how many batches a relay holds when its awaiter is stuck
// on the first: that one, the ones sent and queued for the awaiter, one in
// the sender's hand, one in the claimed channel and one in the claimer's
// hand.
func pipelineDepth(batchSize, window int) int {
	return (1 + (window/batchSize + 2) + 3) * batchSize
}

func TestRelayPipelineKeepsOutcomesWithTheirRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	// A queue that takes five messages and nacks the rest.
	require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{
		Queues:   []broker.Queue{{Name: "limited", Type: broker.QueueClassic, Args: amqp.Table{"x-max-length": int64(5), "x-overflow": "reject-publish"}}},
		Bindings: []broker.Binding{{Queue: "limited", Exchange: testExchange, RoutingKey: "limited.*"}},
	}))

	// Returned and nacked rows are spread over many small batches, several
	// of which are in flight at once.
	keys := map[string]string{}
	var routed []string
	for k := range 30 {
		envs := make([]message.Envelope, 10)
		for i := range envs {
			key := routedKey
			switch n := k*10 + i; {
			case n%7 == 3:
				key = "nobody.listens"
			case n%11 == 5:
				key = "limited.x"
			}
			envs[i] = env(key)
			keys[envs[i].MessageID] = key
			if key == routedKey {
				routed = append(routed, envs[i].MessageID)
			}
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, envs...) }))
	}
	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, BatchSize: 10, Window: 64, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- r.Run(runCtx) }()

	// Wait until every routable row is marked and every failing row was
	// tried at least twice.
	failing := len(keys) - len(routed) - 5
	for {
		var marked, retried int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
  count(*) FILTER (WHERE published_at IS NULL AND attempts >= 2) FROM saga_outbox_state`).Scan(&marked, &retried))
		if marked == len(routed)+5 && retried == failing {
			break
		}
		require.LessOrEqual(t, marked, len(routed)+5)
		select {
		case <-ctx.Done():
			t.Fatalf("%d rows marked, %d of %d failing rows retried", marked, retried, failing)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	require.NoError(t, <-res)

	// A row is marked exactly when its message reached a queue.
	delivered := drain(t, b)
	ch, err := b.consumer.Channel(ctx)
	require.NoError(t, err)
	defer ch.Close()
	for {
		d, ok, err := ch.Get("limited", true)
		require.NoError(t, err)
		if !ok {
			break
		}
		delivered[d.MessageId]++
	}
	rows, err := b.pool.Query(ctx, "SELECT message_id, published_at IS NOT NULL FROM saga_outbox_state")
	require.NoError(t, err)
	var id string
	var published bool
	_, err = pgx.ForEachRow(rows, []any{&id, &published}, func() error {
		if published {
			require.Equal(t, 1, delivered[id], "marked row %s (%s)", id, keys[id])
		} else {
			require.Zero(t, delivered[id], "unmarked row %s (%s)", id, keys[id])
			require.NotEqual(t, routedKey, keys[id])
		}
		return nil
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.Stats().Failed, int64(failing))
	require.Equal(t, int64(len(routed)+5), r.Stats().Published)
}

func TestRelayCancelReleasesUnsentBatches(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	ids := enqueue(t, ctx, b.pool, 100, routedKey)

	// Hold the first batch after its confirms until the pipeline behind it
	// is full, then cancel: the batches already sent are finished, the ones
	// claimed but not sent are released.
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := false
	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, BatchSize: 10, Window: 10, LeaseDuration: time.Minute,
		afterPublish: func([]int64) error {
			if !held {
				held = true
				if err := waitLeased(ctx, b.pool, pipelineDepth(10, 10)); err != nil {
					return err
				}
			}
			cancel()
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, r.Run(runCtx))

	var marked, released, leased int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
  count(*) FILTER (WHERE published_at IS NULL AND attempts = 1 AND lease_owner IS NULL AND lease_until <= now()),
  count(*) FILTER (WHERE published_at IS NULL AND lease_until > now())
FROM saga_outbox_state`).Scan(&marked, &released, &leased))
	require.Zero(t, leased, "no row is left leased")
	require.Positive(t, released, "claimed but unsent rows are released")
	require.Equal(t, int64(marked), r.Stats().Published)
	require.Zero(t, r.Stats().Failed)
	seen := drain(t, b)
	require.Len(t, seen, marked, "only the marked rows were published")

	// Nothing waits for a lease: a new relay takes the rest at once.
	quick, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	startRelay(t, b, RelayConfig{LeaseDuration: time.Minute})
	waitUnpublished(t, quick, b.pool, 0)
	for id, n := range drain(t, b) {
		seen[id] += n
	}
	requireEach(t, seen, ids, 1)
}

func TestRelayCrashWithBatchesInFlight(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	ids := enqueue(t, ctx, b.pool, 100, routedKey)

	errCrash := errors.New("simulated crash")
	_, res := startRelay(t, b, RelayConfig{Owner: "doomed", BatchSize: 10, Window: 10, LeaseDuration: 5 * time.Second,
		afterPublish: func([]int64) error {
			if err := waitLeased(ctx, b.pool, pipelineDepth(10, 10)); err != nil {
				return err
			}
			return errCrash
		}})
	awaitCrash(t, ctx, res, errCrash)
	// Like a dead process, the relay marked and released nothing: every
	// row it claimed is leased to it until the lease runs out.
	var marked, claimed, leased int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
  count(*) FILTER (WHERE attempts > 0),
  count(*) FILTER (WHERE lease_owner = 'doomed' AND lease_until > now())
FROM saga_outbox_state`).Scan(&marked, &claimed, &leased))
	require.Zero(t, marked)
	require.GreaterOrEqual(t, claimed, pipelineDepth(10, 10))
	require.Equal(t, claimed, leased)

	startRelay(t, b, RelayConfig{Owner: "survivor"})
	waitUnpublished(t, ctx, b.pool, 0)
	seen := drain(t, b)
	for _, id := range ids {
		require.GreaterOrEqual(t, seen[id], 1, "message %s lost", id)
	}
}

// countingTracer counts the settle statements a pool runs.
type countingTracer struct{ settles atomic.Int32 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "released AS") {
		c.settles.Add(1)
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestSettlerMergesQueuedBatches(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	require.NoError(t, err)
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, schema.Migrate(ctx, pool))
	enqueue(t, ctx, pool, 20, routedKey)

	r, err := NewRelay(RelayConfig{Pool: pool, Conn: b.conn, Owner: "me", BatchSize: 5})
	require.NoError(t, err)
	claim := func() *batch {
		rows, err := r.claim(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 5)
		bt := &batch{rows: rows, claimedAt: time.Now()}
		bt.work, bt.finish = context.WithTimeout(ctx, time.Minute)
		return bt
	}
	// A stale claim: its lease ran out and this relay claimed the rows
	// again, so its late failure must not release them.
	stale := claim()
	_, err = pool.Exec(ctx, "UPDATE saga_outbox_pending SET lease_until = now() - interval '1 second' WHERE attempts = 1")
	require.NoError(t, err)
	again := claim()
	require.Equal(t, stale.rows[0].id, again.rows[0].id)
	stale.sent, stale.errs = true, make([]error, 5)
	for i := range stale.errs {
		stale.errs[i] = broker.ErrNacked
	}

	ok, mixed, unsent := claim(), claim(), claim()
	ok.sent, ok.errs = true, make([]error, 5)
	mixed.sent, mixed.errs = true, []error{nil, broker.ErrNacked, nil, broker.ErrReturned, nil}
	in := make(chan *batch, 4)
	for _, bt := range []*batch{stale, ok, mixed, unsent} {
		in <- bt
	}
	close(in)
	p := &pipeline{r: r, ctx: ctx, stop: ctx, grace: ctx, crashed: make(chan struct{})}
	p.settler(in)
	require.Equal(t, int32(1), tracer.settles.Load(), "four queued batches, one statement")

	// The statement's now(): released rows back off from it (or not).
	var settledAt time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT published_at FROM saga_outbox_state WHERE id = $1", ok.rows[0].id).Scan(&settledAt))
	state := func(bt *batch) (marked, backingOff, free, leased int) {
		ids := make([]int64, len(bt.rows))
		for i, rw := range bt.rows {
			ids[i] = rw.id
		}
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
  count(*) FILTER (WHERE published_at IS NULL AND lease_owner IS NULL AND lease_until > $2),
  count(*) FILTER (WHERE published_at IS NULL AND lease_owner IS NULL AND lease_until = $2),
  count(*) FILTER (WHERE published_at IS NULL AND lease_owner = 'me' AND lease_until > now())
FROM saga_outbox_state WHERE id = ANY($1)`, ids, settledAt).Scan(&marked, &backingOff, &free, &leased))
		return
	}
	for _, tt := range []struct {
		name                             string
		bt                               *batch
		marked, backingOff, free, leased int
	}{
		{"stale claim", stale, 0, 0, 0, 5},
		{"confirmed", ok, 5, 0, 0, 0},
		{"nacks and returns", mixed, 3, 2, 0, 0},
		{"unsent", unsent, 0, 0, 5, 0},
	} {
		m, bo, f, l := state(tt.bt)
		require.Equal(t, []int{tt.marked, tt.backingOff, tt.free, tt.leased}, []int{m, bo, f, l}, tt.name)
	}
	require.Equal(t, RelayStats{Published: 8, Failed: 7}, r.Stats())
}

// TestHandoffToAStoppedRelayReleases: rows born leased to a relay that is
// not running when their transaction commits are released at once, even
// when the committing consumer's context has already ended (as at
// shutdown), and only while the lease is still the hand-off's.
func TestHandoffToAStoppedRelayReleases(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	ids := enqueue(t, ctx, b.pool, 3, routedKey)
	_, err := b.pool.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'me', lease_until = now() + interval '1 hour', attempts = 1`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'someone else'
WHERE id = (SELECT id FROM saga_outbox WHERE message_id = $1)`, ids[2])
	require.NoError(t, err)
	h := &handoff{}
	var rowIDs []int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM saga_outbox`).Scan(&rowIDs))
	for i, id := range rowIDs {
		h.rows = append(h.rows, row{id: id, attempts: 1, env: message.Envelope{MessageID: ids[i]}})
	}

	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, Owner: "me"})
	require.NoError(t, err)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	r.handoff(ended, h)

	var released, kept int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT
  count(*) FILTER (WHERE lease_owner IS NULL AND lease_until IS NULL AND published_at IS NULL),
  count(*) FILTER (WHERE lease_owner = 'someone else' AND lease_until > now())
FROM saga_outbox_state`).Scan(&released, &kept))
	require.Equal(t, 2, released, "the relay's own rows are free for any relay to claim")
	require.Equal(t, 1, kept, "a row leased to another relay since is not touched")
	require.Zero(t, r.Stats().HandedOff)
}

// TestHandoffsQueuedAtStopArePublished: rows a consumer handed over while
// the relay was open, still queued when Run's context ends, are published
// within the drain; the claimed batches not yet sent are released.
func TestHandoffsQueuedAtStopArePublished(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	claimed := enqueue(t, ctx, b.pool, 100, routedKey)
	// Three rows committed by a consumer of this process: born leased to
	// the relay, not claimable.
	envs := []message.Envelope{env(routedKey), env(routedKey), env(routedKey)}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, envs...) }))
	h := &handoff{deadline: time.Now().Add(time.Hour)}
	var handed []string
	for _, e := range envs {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, `UPDATE saga_outbox_pending SET lease_owner = 'drainer', lease_until = now() + interval '1 hour', attempts = 1
WHERE id = (SELECT id FROM saga_outbox WHERE message_id = $1) RETURNING id`, e.MessageID).Scan(&id))
		h.rows = append(h.rows, row{id: id, attempts: 1, env: e})
		handed = append(handed, e.MessageID)
	}

	// Hold the first batch after its confirms until the pipeline behind
	// it is full (the sender waits), queue the hand-off, end Run's
	// context, then let the pipeline go on.
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r *Relay
	held := false
	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, Owner: "drainer", BatchSize: 10, Window: 10, LeaseDuration: time.Minute,
		afterPublish: func([]int64) error {
			if !held {
				held = true
				if err := waitLeased(ctx, b.pool, pipelineDepth(10, 10)+len(handed)); err != nil {
					return err
				}
				r.handoff(ctx, h)
				cancel()
			}
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, r.Run(runCtx))

	require.EqualValues(t, len(handed), r.Stats().HandedOff)
	var unpublishedHanded int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state WHERE message_id = ANY($1) AND published_at IS NULL`, handed).Scan(&unpublishedHanded))
	require.Zero(t, unpublishedHanded, "the queued hand-off was published during the drain")
	seen := drain(t, b)
	requireEach(t, seen, handed, 1)
	var releasedClaimed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state WHERE message_id = ANY($1) AND published_at IS NULL AND lease_owner IS NULL`, claimed).Scan(&releasedClaimed))
	require.Positive(t, releasedClaimed, "claimed batches not yet sent are still released")
}
