package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/bench/internal/benv"
	"github.com/protosaga/saga/bench/internal/raw"
	"github.com/protosaga/saga/bench/internal/report"
	"github.com/protosaga/saga/bench/internal/wm"
	"github.com/protosaga/saga/examples/placeorder/app"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/schema"
)

// oursConfig is the part of app.Config a measurement varies.
type oursConfig struct {
	Relays, Concurrency, Prefetch, BatchSize int
	QueueType                                string
}

func (c oursConfig) String() string {
	s := fmt.Sprintf("workers %d", max(c.Concurrency, 0))
	if c.Concurrency == 0 {
		s = "workers default(4)"
	}
	if c.BatchSize != 0 {
		s += fmt.Sprintf(", batch %d", c.BatchSize)
	}
	if c.Prefetch != 0 {
		s += fmt.Sprintf(", prefetch %d", c.Prefetch)
	}
	if c.Relays > 1 {
		s += fmt.Sprintf(", %d relays", c.Relays)
	}
	return s
}

// oursSystem is the Place Order example (examples/placeorder/app) on a
// fresh schema and vhost.
type oursSystem struct {
	infra
	host       *host.Host
	placeOrder *orderv1.PlaceOrder
}

func newOurs(ctx context.Context, env *benv.Env, c oursConfig, logger *slog.Logger) (*oursSystem, error) {
	s := &oursSystem{}
	var err error
	if s.schema, err = env.NewSchema(ctx, "ours"); err != nil {
		return nil, err
	}
	if s.vhost, err = env.NewVHost(ctx, "ours"); err != nil {
		s.Close()
		return nil, err
	}
	workers := c.Concurrency
	if workers == 0 {
		workers = 4
	}
	// host.Config.Pool: 4 per relay, Concurrency+1 per consumer (five here:
	// four participants and the saga), 4 for starts, reads and gauges; plus
	// headroom for the benchmark's own polls.
	relays := max(c.Relays, 1)
	if s.pool, err = s.schema.Pool(ctx, int32(4*relays+5*(workers+1)+4+4), &s.stmts); err != nil {
		s.Close()
		return nil, err
	}
	relaysCfg := c.Relays
	if relaysCfg == 0 {
		relaysCfg = 1
	}
	s.host, err = host.New(ctx, host.Config{
		Service: "sagabench", Pool: s.pool, AMQPURL: s.vhost.URL, HTTPAddr: host.HTTPOff,
		QueueType: broker.QueueType(c.QueueType), Relays: relaysCfg,
		Concurrency: c.Concurrency, Prefetch: c.Prefetch, BatchSize: c.BatchSize,
		// Every reservation updates a few hot stock rows: one worker applying
		// whole batches shares the commit and never waits on the others.
		Queues: map[string]host.QueueTuning{"inventory.commands": {Concurrency: 1}},
		Logger: logger,
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	if s.placeOrder, err = app.Register(s.host); err == nil {
		err = s.host.Migrate(ctx) // the sagas are pre-loaded before Run
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := wm.Restock(ctx, s.pool); err != nil { // the same inventory_stock table
		s.Close()
		return nil, err
	}
	return s, nil
}

// StartBatch starts reqs in one transaction of the engine's (saga.Engine.InTx),
// as a service that starts sagas in the host's process does: their first
// commands are handed to the host's relay after the commit, born leased to
// it, instead of notifying every relay to claim them.
func (s *oursSystem) StartBatch(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error {
	return s.placeOrder.Engine().InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		for _, r := range reqs {
			if _, _, err := s.placeOrder.StartTx(ctx, tx, r, message.Meta{}); err != nil {
				return fmt.Errorf("start order %s: %w", r.GetOrderId(), err)
			}
		}
		return nil
	})
}

func (s *oursSystem) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	if _, _, err := s.placeOrder.Start(ctx, req, message.Meta{}); err != nil {
		return fmt.Errorf("start order %s: %w", req.GetOrderId(), err)
	}
	return nil
}

func (s *oursSystem) Run(ctx context.Context) error { return s.host.Run(ctx) }

// StepsDone: every applied transition writes an audit row of class "new";
// each saga's first is its start.
func (s *oursSystem) StepsDone(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT (SELECT count(*) FROM saga_audit WHERE class = 'new') - (SELECT count(*) FROM saga_place_order)`)
}

func (s *oursSystem) Unhappy(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM saga_place_order WHERE state IN ('`+
		string(orderv1.PlaceOrderStateFailed)+`', '`+string(orderv1.PlaceOrderStateManualReview)+`', '`+string(orderv1.PlaceOrderStateCancelled)+`')
		OR state LIKE 'COMPENSATING%'`)
}

func (s *oursSystem) Completed(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM saga_place_order WHERE state = '`+string(orderv1.PlaceOrderStateCompleted)+`'`)
}

// Latencies: a step is the time between two consecutive transitions of one
// saga in saga_audit (at = the engine's clock when it applied the
// transition): from the saga handling one reply (and writing the next
// command to the outbox) to it handling the next reply. The whole saga is
// created_at to updated_at of a completed instance.
func (s *oursSystem) Latencies(ctx context.Context) (latency, error) {
	return latencyQuery(ctx, s.pool, `
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT extract(epoch FROM at - lag(at) OVER (PARTITION BY saga_id ORDER BY id)) AS s
  FROM saga_audit WHERE class = 'new') d WHERE s IS NOT NULL`,
		`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT extract(epoch FROM updated_at - created_at) AS s FROM saga_place_order WHERE state = 'COMPLETED') d`)
}

func (s *oursSystem) Close() {
	if s.host != nil {
		s.host.Close() // a no-op once Run has stopped it
	}
	s.close()
}

// relayBench pre-fills n outbox rows (relayEnvelope) bound for a quorum
// queue through a direct exchange (the kind the generator gives command and
// reply exchanges), then runs the given number of relays and measures how fast the rows
// are published and confirmed.
func relayBench(ctx context.Context, env *benv.Env, relays, batch, window, n int, limit time.Duration, logger *slog.Logger) ([]report.Metric, error) {
	sc, err := env.NewSchema(ctx, "relay")
	if err != nil {
		return nil, err
	}
	defer sc.Drop()
	vh, err := env.NewVHost(ctx, "relay")
	if err != nil {
		return nil, err
	}
	defer vh.Drop()
	pool, err := sc.Pool(ctx, int32(2*relays+4))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := schema.Migrate(ctx, pool); err != nil {
		return nil, fmt.Errorf("relay bench: migrate: %w", err)
	}
	if err := declareRelayTopology(ctx, vh, logger); err != nil {
		return nil, err
	}
	for from := 0; from < n; from += 1000 {
		envs := make([]message.Envelope, 0, 1000)
		for i := from; i < min(from+1000, n); i++ {
			envs = append(envs, relayEnvelope(i))
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, envs...) }); err != nil {
			return nil, fmt.Errorf("relay bench: fill outbox: %w", err)
		}
	}
	var rs []*outbox.Relay
	var conns []*broker.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := range relays {
		c, err := broker.Dial(ctx, vh.URL, broker.ConnConfig{Name: fmt.Sprintf("relay-%d", i), Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("relay bench: dial relay %d: %w", i, err)
		}
		conns = append(conns, c)
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Conn: c, BatchSize: batch, Window: window, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("relay bench: relay %d: %w", i, err)
		}
		rs = append(rs, r)
	}
	benv.Settle()
	before, err := env.Sample(ctx)
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, relays)
	start := time.Now()
	for _, r := range rs {
		go func() { errc <- r.Run(runCtx) }()
	}
	published := func() int64 {
		var p int64
		for _, r := range rs {
			p += r.Stats().Published
		}
		return p
	}
	deadline := start.Add(limit)
	for published() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	done := published()
	after, err := env.Sample(ctx)
	stop()
	for range rs {
		<-errc
	}
	if err != nil {
		return nil, err
	}
	if done < int64(n) {
		return nil, fmt.Errorf("relay bench: %d of %d rows published within %s", done, n, limit)
	}
	var unpublished int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox_state WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		return nil, fmt.Errorf("relay bench: count unpublished: %w", err)
	}
	if unpublished != 0 {
		return nil, fmt.Errorf("relay bench: %d rows still unpublished after the relays reported all %d published", unpublished, n)
	}
	d := after.Sub(before)
	out := []report.Metric{{Name: "msgs/s", Value: float64(done) / elapsed.Seconds()},
		{Name: "client CPU µs/msg", Value: ms(d.Self) * 1000 / float64(done)}}
	if d.PostgresOK {
		out = append(out, report.Metric{Name: "PostgreSQL CPU µs/msg", Value: ms(d.Postgres) * 1000 / float64(done)})
	}
	if d.RabbitOK {
		out = append(out, report.Metric{Name: "RabbitMQ CPU µs/msg", Value: ms(d.Rabbit) * 1000 / float64(done)})
	}
	if d.NetworkOK {
		out = append(out, report.Metric{Name: "emulated network (netwire) CPU µs/msg", Value: ms(d.Network) * 1000 / float64(done)})
	}
	return out, nil
}

// relayEnvelope is the i-th message of the relay measurements: a ~300-byte
// body with the envelope fields a saga's command carries (saga id and type,
// causation, idempotency key; no trace context, as telemetry is off in the
// measurements), to the direct exchange declareRelayTopology declares.
func relayEnvelope(i int) message.Envelope {
	id := fmt.Sprintf("relay-%08d", i)
	return message.Envelope{
		MessageID: id, CorrelationID: "bench-" + id, CausationID: "cause-" + id,
		SagaID: "saga-" + id, SagaType: "bench.v1.Relay", IdempotencyKey: "key-" + id,
		MessageType: "bench.v1.RelayCommand", SchemaVersion: 1, OccurredAt: time.Now(),
		Exchange: "bench.relay", RoutingKey: "bench.relay", Body: raw.Body,
	}
}

// declareRelayTopology declares the relay measurements' direct exchange
// bound to a quorum queue on vh.
func declareRelayTopology(ctx context.Context, vh *benv.VHost, logger *slog.Logger) error {
	conn, err := broker.Dial(ctx, vh.URL, broker.ConnConfig{Name: "relay-bench", Logger: logger})
	if err != nil {
		return fmt.Errorf("relay bench: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("relay bench: channel: %w", err)
	}
	defer ch.Close()
	topo := broker.Topology{
		Exchanges: []broker.Exchange{{Name: "bench.relay", Kind: "direct"}},
		Queues:    []broker.Queue{{Name: "bench.relay.q", Type: broker.QueueQuorum}},
		Bindings:  []broker.Binding{{Queue: "bench.relay.q", Exchange: "bench.relay", RoutingKey: "bench.relay"}},
	}
	if err := broker.Declare(ctx, ch, topo); err != nil {
		return fmt.Errorf("relay bench: declare: %w", err)
	}
	return nil
}

// relayWindow is the relay's default confirm window (outbox.RelayConfig.Window).
const relayWindow = 1024

// sameShapeBench publishes the relay measurement's n messages — the AMQP
// messages the relay makes of them (message.Envelope.Publishing), to the
// same exchange and routing key, mandatory, with the relay's default window
// of outstanding confirms — straight from amqp091-go on one channel: what
// the relay would reach if its database work cost nothing.
func sameShapeBench(ctx context.Context, env *benv.Env, n int, logger *slog.Logger) ([]report.Metric, error) {
	vh, err := env.NewVHost(ctx, "shape")
	if err != nil {
		return nil, err
	}
	defer vh.Drop()
	if err := declareRelayTopology(ctx, vh, logger); err != nil {
		return nil, err
	}
	msgs := make([]raw.Shaped, n)
	for i := range msgs {
		e := relayEnvelope(i)
		msgs[i] = raw.Shaped{Exchange: e.Exchange, RoutingKey: e.RoutingKey, Publishing: e.Publishing()}
	}
	benv.Settle()
	before, err := env.Sample(ctx)
	if err != nil {
		return nil, err
	}
	r, err := raw.PublishShaped(ctx, vh.URL, msgs, relayWindow, true)
	if err != nil {
		return nil, fmt.Errorf("same-shape publish: %w", err)
	}
	after, err := env.Sample(ctx)
	if err != nil {
		return nil, err
	}
	d := after.Sub(before)
	out := []report.Metric{{Name: "msgs/s", Value: r.PerSecond()},
		{Name: "client CPU µs/msg", Value: ms(d.Self) * 1000 / float64(r.N)}}
	if d.RabbitOK {
		out = append(out, report.Metric{Name: "RabbitMQ CPU µs/msg", Value: ms(d.Rabbit) * 1000 / float64(r.N)})
	}
	if d.NetworkOK {
		out = append(out, report.Metric{Name: "emulated network (netwire) CPU µs/msg", Value: ms(d.Network) * 1000 / float64(r.N)})
	}
	return out, nil
}
