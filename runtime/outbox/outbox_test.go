package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry"
)

const (
	testExchange = "shop"
	testQueue    = "events"
	routedKey    = "order.placed"
)

type testBundle struct {
	pool     *pgxpool.Pool
	amqpURL  string
	conn     *broker.Conn // the relays' connection
	consumer *broker.Conn // the test's own connection
	ch       *amqp.Channel
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupOn(t, testenv.AMQP(t))
}

// setupOn is setup on the broker at amqpURL.
func setupOn(t *testing.T, amqpURL string) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := &testBundle{pool: testenv.Postgres(t), amqpURL: amqpURL}
	require.NoError(t, schema.Migrate(ctx, b.pool))

	var err error
	b.conn, err = broker.Dial(ctx, b.amqpURL, broker.ConnConfig{Name: "relay", MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.conn.Close() })

	b.consumer, err = broker.Dial(ctx, b.amqpURL, broker.ConnConfig{Name: "consumer", MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.consumer.Close() })
	b.ch, err = b.consumer.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: testExchange}},
		Queues:    []broker.Queue{{Name: testQueue, Type: broker.QueueClassic}},
		Bindings:  []broker.Binding{{Queue: testQueue, Exchange: testExchange, RoutingKey: "order.*"}},
	}))
	return b
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func env(key string) message.Envelope {
	id := uuid.Must(uuid.NewV7()).String()
	return message.Envelope{
		MessageID: id, CorrelationID: "corr", MessageType: "shop.v1.OrderPlaced", SchemaVersion: 1,
		Exchange: testExchange, RoutingKey: key, Body: []byte(id), OccurredAt: time.Now(),
	}
}

// enqueue commits n messages in one transaction and returns their ids.
func enqueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int, key string) []string {
	t.Helper()
	envs := make([]message.Envelope, n)
	ids := make([]string, n)
	for i := range envs {
		envs[i] = env(key)
		ids[i] = envs[i].MessageID
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, envs...) }))
	return ids
}

// startRelay runs a relay until the test ends and returns it with a
// channel that receives Run's result.
func startRelay(t *testing.T, b *testBundle, cfg RelayConfig) (*Relay, <-chan error) {
	t.Helper()
	cfg.Pool, cfg.Conn = b.pool, b.conn
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	r, err := NewRelay(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		res <- r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop")
		}
	})
	return r, res
}

// awaitCrash waits for a relay's Run to return the simulated crash want.
func awaitCrash(t *testing.T, ctx context.Context, res <-chan error, want error) {
	t.Helper()
	select {
	case err := <-res:
		require.ErrorIs(t, err, want)
	case <-ctx.Done():
		t.Fatal("relay did not crash")
	}
}

// waitUnpublished waits until exactly want outbox rows are unpublished.
func waitUnpublished(t *testing.T, ctx context.Context, pool *pgxpool.Pool, want int) {
	t.Helper()
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL").Scan(&n))
		if n == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d outbox rows unpublished, want %d", n, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// drain returns how often each message id is in the queue, emptying it.
// Every confirmed publish is in the queue by the time its row is marked, so
// after waitUnpublished(…, 0) this sees every copy ever published.
func drain(t *testing.T, b *testBundle) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := b.consumer.Channel(ctx) // a fresh one: tests kill connections
	require.NoError(t, err)
	defer ch.Close()
	seen := map[string]int{}
	for {
		d, ok, err := ch.Get(testQueue, true)
		require.NoError(t, err)
		if !ok {
			return seen
		}
		seen[d.MessageId]++
	}
}

func requireEach(t *testing.T, seen map[string]int, ids []string, times int) {
	t.Helper()
	for _, id := range ids {
		require.Equal(t, times, seen[id], "message %s", id)
	}
}

func TestRelayPublishesCommittedRowsOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	var ids []string
	for range 5 {
		ids = append(ids, enqueue(t, ctx, b.pool, 100, routedKey)...)
	}
	r, _ := startRelay(t, b, RelayConfig{BatchSize: 64, Window: 16})
	waitUnpublished(t, ctx, b.pool, 0)

	seen := drain(t, b)
	require.Len(t, seen, len(ids))
	requireEach(t, seen, ids, 1)
	require.Equal(t, RelayStats{Published: int64(len(ids))}, r.Stats())

	var attempts, owners int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT max(attempts), count(DISTINCT published_by) FROM saga_outbox_state").Scan(&attempts, &owners))
	require.Equal(t, 1, attempts)
	require.Equal(t, 1, owners)
}

func TestRelayPublishesEnvelope(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	e := env(routedKey)
	e.CausationID, e.SagaID, e.SagaType, e.IdempotencyKey = "cause", "saga", "PlaceOrder", "idem"
	e.Traceparent, e.Tracestate = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
	e.Headers = map[string]any{message.HeaderAttempt: 3, "note": "x"}
	e.OccurredAt = time.Date(2024, 1, 2, 3, 4, 5, 6000, time.UTC)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, e) }))

	startRelay(t, b, RelayConfig{})
	waitUnpublished(t, ctx, b.pool, 0)
	d, ok, err := b.ch.Get(testQueue, true)
	require.NoError(t, err)
	require.True(t, ok)
	got, err := message.FromDelivery(&d)
	require.NoError(t, err)
	want := e
	want.Headers = map[string]any{message.HeaderAttempt: int64(3), "note": "x"}
	require.Equal(t, want, got)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
}

func TestRelayRolledBackPublishesNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	startRelay(t, b, RelayConfig{})

	rolledBack := env(routedKey)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, Enqueue(ctx, tx, rolledBack))
	require.NoError(t, tx.Rollback(ctx))
	committed := enqueue(t, ctx, b.pool, 1, routedKey)

	waitUnpublished(t, ctx, b.pool, 0)
	require.Equal(t, map[string]int{committed[0]: 1}, drain(t, b))
}

func TestRelayCrashAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	ids := enqueue(t, ctx, b.pool, 20, routedKey)

	errCrash := errors.New("simulated crash")
	var crashed []int64
	_, res := startRelay(t, b, RelayConfig{
		Owner:         "doomed",
		LeaseDuration: time.Second,
		afterPublish: func(ids []int64) error {
			crashed = ids
			// While publishing, the claim is committed (visible to others)
			// and no row lock is held: no transaction spans network I/O.
			var leased int
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT id FROM saga_outbox_pending WHERE lease_owner = 'doomed' FOR UPDATE NOWAIT) l").Scan(&leased)
			})
			if err != nil || leased != 20 {
				return fmt.Errorf("claim not committed or rows still locked: %d leased: %w", leased, err)
			}
			return errCrash
		},
	})
	awaitCrash(t, ctx, res, errCrash)
	require.Len(t, crashed, 20)
	waitUnpublished(t, ctx, b.pool, 20) // published, but not marked

	// A second relay takes over once the lease runs out and publishes the
	// rows again: consumers see each message twice, with the same id.
	startRelay(t, b, RelayConfig{Owner: "survivor"})
	waitUnpublished(t, ctx, b.pool, 0)
	requireEach(t, drain(t, b), ids, 2)

	var attempts int
	var owner string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT min(attempts), min(published_by) FROM saga_outbox_state").Scan(&attempts, &owner))
	require.Equal(t, 2, attempts)
	require.Equal(t, "survivor", owner)
}

func TestTwoRelaysAtOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	r1, _ := startRelay(t, b, RelayConfig{Owner: "one", BatchSize: 25, Window: 8})
	r2, _ := startRelay(t, b, RelayConfig{Owner: "two", BatchSize: 25, Window: 8})
	var ids []string
	for range 20 {
		ids = append(ids, enqueue(t, ctx, b.pool, 100, routedKey)...)
	}
	waitUnpublished(t, ctx, b.pool, 0)

	seen := drain(t, b)
	require.Len(t, seen, len(ids))
	requireEach(t, seen, ids, 1) // leases: no row is published by both
	require.Equal(t, int64(len(ids)), r1.Stats().Published+r2.Stats().Published, "no row marked twice")
	t.Logf("relay one published %d, relay two %d", r1.Stats().Published, r2.Stats().Published)
}

func TestRelaySurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	r, _ := startRelay(t, b, RelayConfig{BatchSize: 200, Window: 32})

	// Keep the relay busy while broker connections are killed. The
	// management API lists a connection only a few seconds after it opens,
	// so kill again until the relay's connection was hit mid-batch (in 1
	// of 29 runs five kills were not enough).
	var ids []string
	for kills := 0; r.Stats().Failed == 0; kills++ {
		require.Less(t, kills, 10, "the relay's connection was never killed mid-batch")
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			testenv.KillAMQPConnections(t, b.amqpURL)
		}()
		for running := true; running; {
			select {
			case <-killed:
				running = false
			default:
			}
			ids = append(ids, enqueue(t, ctx, b.pool, 50, routedKey)...)
			time.Sleep(10 * time.Millisecond)
		}
	}
	ids = append(ids, enqueue(t, ctx, b.pool, 200, routedKey)...)
	waitUnpublished(t, ctx, b.pool, 0)

	seen := drain(t, b)
	for _, id := range ids {
		require.GreaterOrEqual(t, seen[id], 1, "message %s lost", id)
	}
	t.Logf("%d messages, %d publishes failed and were repeated", len(ids), r.Stats().Failed)
}

func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	listening := make(chan struct{}, 10)
	mp := metrictest.New(t)
	startRelay(t, b, RelayConfig{PollInterval: time.Hour, onListen: func() { listening <- struct{}{} },
		Telemetry: telemetry.Providers{Meter: mp}})
	<-listening
	require.Zero(t, mp.Value(t, telemetry.MetricListenReconnects, nil))

	// The relay found nothing at start and will not poll for an hour: only
	// the notification from the commit can make it publish.
	first := enqueue(t, ctx, b.pool, 3, routedKey)
	waitUnpublished(t, ctx, b.pool, 0)
	requireEach(t, drain(t, b), first, 1)

	// The LISTEN connection comes back after the database drops it.
	require.Positive(t, testenv.KillPostgresConnections(t, b.pool))
	select {
	case <-listening:
	case <-ctx.Done():
		t.Fatal("listener did not reconnect")
	}
	require.EqualValues(t, 1, mp.Value(t, telemetry.MetricListenReconnects, nil), "the reconnect is counted")
	second := enqueue(t, ctx, b.pool, 3, routedKey)
	waitUnpublished(t, ctx, b.pool, 0)
	requireEach(t, drain(t, b), second, 1)
}

func TestRelayUnroutableIsNotMarked(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	r, _ := startRelay(t, b, RelayConfig{})
	lost := enqueue(t, ctx, b.pool, 1, "nobody.listens")[0]
	routed := enqueue(t, ctx, b.pool, 1, routedKey)[0]

	// The routable message goes out; the unroutable one is returned,
	// released and tried again, never marked.
	waitUnpublished(t, ctx, b.pool, 1)
	for {
		var attempts int
		var published bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT attempts, published_at IS NOT NULL FROM saga_outbox_state WHERE message_id = $1", lost).Scan(&attempts, &published))
		require.False(t, published)
		if attempts >= 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("unroutable row not retried")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.GreaterOrEqual(t, r.Stats().Failed, int64(2))

	// Once a queue is bound for it, it is delivered.
	require.NoError(t, b.ch.QueueBind(testQueue, "nobody.listens", testExchange, false, nil))
	waitUnpublished(t, ctx, b.pool, 0)
	require.Equal(t, map[string]int{routed: 1, lost: 1}, drain(t, b))
}

func TestRelayMissingExchangeBlocksNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	bad := env(routedKey)
	bad.Exchange = "no-such-exchange"
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, bad) }))
	ids := enqueue(t, ctx, b.pool, 50, routedKey)

	// The bad row comes first in every batch; the others still go out.
	startRelay(t, b, RelayConfig{BatchSize: 10})
	waitUnpublished(t, ctx, b.pool, 1)
	seen := drain(t, b)
	require.Len(t, seen, len(ids))
	requireEach(t, seen, ids, 1)
	var published bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT published_at IS NOT NULL FROM saga_outbox_state WHERE message_id = $1", bad.MessageID).Scan(&published))
	require.False(t, published)
}

// A pending row whose outbox row was deleted by hand has nothing to
// publish: the relay deletes it, says which, and publishes the rest.
func TestRelayDropsPendingRowsWithoutOutboxRow(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	ids := enqueue(t, ctx, b.pool, 5, routedKey)
	var gone int64
	require.NoError(t, b.pool.QueryRow(ctx, "DELETE FROM saga_outbox WHERE message_id = $1 RETURNING id", ids[2]).Scan(&gone))

	var logs testenv.LogBuffer
	r, _ := startRelay(t, b, RelayConfig{BatchSize: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for {
		var pending int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM saga_outbox_pending").Scan(&pending))
		if pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d pending rows left", pending)
		case <-time.After(20 * time.Millisecond):
		}
	}
	seen := drain(t, b)
	require.Len(t, seen, 4)
	requireEach(t, seen, append(ids[:2:2], ids[3:]...), 1)
	// The relay counts a batch after its settle commits, so the pending
	// table can be empty a moment before the counters move.
	require.Eventually(t, func() bool {
		st := r.Stats()
		return st.Published >= 4 && st.Orphans >= 1 && strings.Contains(logs.String(), "pending rows had no outbox row")
	}, 10*time.Second, 10*time.Millisecond)
	stats := r.Stats()
	require.EqualValues(t, 4, stats.Published)
	require.EqualValues(t, 1, stats.Orphans)
	require.Contains(t, logs.String(), `level=ERROR msg="outbox relay: pending rows had no outbox row`)
	require.Contains(t, logs.String(), fmt.Sprintf("outbox_ids=[%d]", gone))
}

// A row written around Enqueue's checks that AMQP cannot carry (here a
// correlation id longer than a short string) fails alone: the messages
// behind it in its batches go out, and it backs off instead of being
// claimed again at once.
func TestRelayUnsendableRowBlocksNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	var bad int64
	require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, correlation_id, body, occurred_at)
VALUES ($1, $2, $3, 'shop.v1.OrderPlaced', 1, repeat('c', 300), '', now()) RETURNING id`,
		uuid.Must(uuid.NewV7()).String(), testExchange, routedKey).Scan(&bad))
	ids := enqueue(t, ctx, b.pool, 50, routedKey)

	var logs testenv.LogBuffer
	startRelay(t, b, RelayConfig{BatchSize: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	waitUnpublished(t, ctx, b.pool, 1)
	seen := drain(t, b)
	require.Len(t, seen, len(ids))
	requireEach(t, seen, ids, 1)
	require.Contains(t, logs.String(), "message cannot be sent over AMQP: correlation id is 300 bytes")

	// Backing off: 100 ms, 200 ms, 400 ms… between its claims, where a row
	// failed by a connection-level error was claimed again about every
	// 5 ms (about 200 claims a second).
	time.Sleep(2 * time.Second)
	var attempts int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT attempts FROM saga_outbox_pending WHERE id = $1`, bad).Scan(&attempts))
	require.Less(t, attempts, 12, "the unsendable row is claimed again without backing off")
}

// stoppable runs a relay with cfg (Pool and PollInterval as startRelay
// sets them) and returns a stop that cancels it and fails the test, naming
// what, unless Run returns nil soon after.
func stoppable(t *testing.T, b *testBundle, cfg RelayConfig, what string) (r *Relay, stop func()) {
	t.Helper()
	cfg.Pool, cfg.PollInterval = b.pool, 50*time.Millisecond
	r, err := NewRelay(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	res := make(chan error, 1)
	go func() { res <- r.Run(ctx) }()
	return r, func() {
		t.Helper()
		cancel()
		select {
		case err := <-res:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("Run did not return while %s", what)
		}
	}
}

// TestRelayStopsWhileTheBrokerStopsAnswering: the broker stops reading and
// answering the relay's connection (a resource alarm, a half-dead path)
// while rows are in flight. Their confirms time out, the channel's close is
// never answered, and a new channel cannot be opened; Run must still return
// once its context ends.
func TestRelayStopsWhileTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := setup(t)
	proxy := testenv.NewProxy(t, b.amqpURL)
	conn, err := broker.Dial(ctx, proxy.URL, broker.ConnConfig{Name: "frozen-relay", Heartbeat: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { go func() { _ = conn.Close() }() }) // frozen: may never finish

	enqueue(t, ctx, b.pool, 5, routedKey)
	r, stop := stoppable(t, b, RelayConfig{Conn: conn, LeaseDuration: 3 * time.Second, ConfirmTimeout: time.Second},
		"the broker was not answering")
	waitUnpublished(t, ctx, b.pool, 0)

	proxy.Freeze()
	enqueue(t, ctx, b.pool, 5, routedKey)
	require.Eventually(t, func() bool { return r.Stats().Failed >= 5 }, 20*time.Second, 20*time.Millisecond,
		"the confirms of the rows sent into the frozen connection did not time out")
	stop()
}

// TestRelayUnderAResourceAlarm raises a real memory alarm on a broker of the
// test's own while a relay runs. The broker blocks the relay's connection at
// its next publish; the relay then claims nothing (no rows claimed and
// failed over and over), still stops when asked, and a relay started after
// the alarm clears publishes every row.
func TestRelayUnderAResourceAlarm(t *testing.T) {
	t.Parallel()
	svc := testenv.PrivateServices(t)
	ctx := testCtx(t)
	b := setupOn(t, svc.AMQPURL)

	first := enqueue(t, ctx, b.pool, 3, routedKey)
	var logs testenv.LogBuffer
	_, stop := stoppable(t, b, RelayConfig{Conn: b.conn, LeaseDuration: 3 * time.Second, ConfirmTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, "the broker blocked its connection")
	waitUnpublished(t, ctx, b.pool, 0)

	_, err := svc.RabbitCtl(ctx, "set_vm_memory_high_watermark", "0.000001")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = svc.RabbitCtl(context.Background(), "set_vm_memory_high_watermark", "0.4") })
	require.Eventually(t, func() bool {
		alarms, err := svc.RabbitCtl(ctx, "eval", "rabbit_alarm:get_alarms().")
		return err == nil && strings.Contains(alarms, "memory")
	}, 30*time.Second, 100*time.Millisecond, "no memory alarm")
	second := enqueue(t, ctx, b.pool, 20, routedKey)
	require.Eventually(t, func() bool { _, blocked := b.conn.Blocked(); return blocked }, 30*time.Second, 20*time.Millisecond,
		"the broker did not block the relay's connection")
	time.Sleep(2 * time.Second) // what a relay claiming while blocked would spin through
	var attempts int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT coalesce(max(attempts), 0) FROM saga_outbox_pending").Scan(&attempts))
	require.LessOrEqual(t, attempts, 2, "rows were claimed again and again while the connection was blocked")
	require.Contains(t, logs.String(), "the broker blocked the connection; claiming nothing until it unblocks")

	stop()

	_, err = svc.RabbitCtl(ctx, "set_vm_memory_high_watermark", "0.4")
	require.NoError(t, err)
	startRelay(t, b, RelayConfig{})
	waitUnpublished(t, ctx, b.pool, 0)
	seen := drain(t, b)
	requireEach(t, seen, first, 1)
	for _, id := range second {
		require.GreaterOrEqual(t, seen[id], 1, "message %s", id)
	}
}

func TestRunDrainsOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	enqueue(t, ctx, b.pool, 10, routedKey)

	// Cancel while the batch is in flight: Run still marks it, then returns.
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := NewRelay(RelayConfig{Pool: b.pool, Conn: b.conn, afterPublish: func([]int64) error {
		cancel()
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, r.Run(runCtx))
	require.Equal(t, int64(10), r.Stats().Published)
	waitUnpublished(t, ctx, b.pool, 0)

	// An idle relay returns at once.
	idle, cancelIdle := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- r.Run(idle) }()
	cancelIdle()
	require.NoError(t, <-res)
}

var testInfo = sagatest.Type{FullName: "shop.v1.OrderPlaced", Kind: message.KindEvent, Exchange: testExchange, RoutingKey: routedKey,
	SchemaVersion: 2, IdempotencyKey: func(string) string { return "" }, CorrelationKey: func(string) string { return "" }}.Info()

func TestPublishAndEnqueueErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))

	var (
		id  string
		err error
	)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err = Publish(ctx, tx, sagatest.NewMessage(testInfo, "o-1"), message.Meta{SagaID: "saga-1"})
		return err
	}))
	var typ, corr, ex, key string
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT message_type, schema_version, correlation_id, exchange, routing_key FROM saga_outbox WHERE message_id = $1", id).
		Scan(&typ, &version, &corr, &ex, &key))
	require.Equal(t, []any{"shop.v1.OrderPlaced", 2, "saga-1", testExchange, routedKey}, []any{typ, version, corr, ex, key})

	tests := []struct {
		env  message.Envelope
		want string
	}{
		{message.Envelope{MessageType: "t", SchemaVersion: 1}, "empty message id"},
		{message.Envelope{MessageID: "m", SchemaVersion: 1}, "message m: empty message type"},
		{message.Envelope{MessageID: "m", MessageType: "t"}, "message m: schema version 0"},
		{message.Envelope{MessageID: "m", MessageType: "t", SchemaVersion: 1, Headers: map[string]any{"f": func() {}}}, "message m: encode headers"},
		{message.Envelope{MessageID: id, MessageType: "t", SchemaVersion: 1}, fmt.Sprintf("enqueue outbox message %s", id)},
		// What the relay could never publish is refused here, not claimed
		// and failed for ever.
		{message.Envelope{MessageID: "m", MessageType: "t", SchemaVersion: 1, CorrelationID: strings.Repeat("c", 256)},
			"message m: message cannot be sent over AMQP: correlation id is 256 bytes, at most 255 fit"},
		{message.Envelope{MessageID: "m", MessageType: "t", SchemaVersion: 1, RoutingKey: strings.Repeat("k", 300)}, "routing key is 300 bytes"},
		{message.Envelope{MessageID: strings.Repeat("i", 256), MessageType: "t", SchemaVersion: 1}, "message id is 256 bytes"},
		{message.Envelope{MessageID: "m", MessageType: "t", SchemaVersion: 1, Headers: map[string]any{"x-outer": map[string]any{strings.Repeat("h", 256): 1}}},
			`header "x-outer": message cannot be sent over AMQP: header name hhhh`},
	}
	for _, tt := range tests {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, tt.env) })
		require.ErrorContains(t, err, tt.want)
	}

	_, err = NewRelay(RelayConfig{LeaseDuration: time.Second, ConfirmTimeout: 2 * time.Second})
	for _, want := range []string{"Pool is required", "Conn is required", "ConfirmTimeout 2s must be shorter"} {
		require.ErrorContains(t, err, want)
	}
}
