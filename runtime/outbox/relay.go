package outbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/telemetry"
)

// RelayConfig configures a Relay. Pool and Conn are required.
type RelayConfig struct {
	// Pool is the database holding saga_outbox. The relay takes one
	// connection out of it for LISTEN.
	Pool *pgxpool.Pool
	// Conn is the broker connection to publish on. Use a connection of its
	// own, not the one consumers use.
	Conn *broker.Conn
	// Owner identifies this relay in lease_owner; default
	// "<hostname>-<pid>-<random>". Each running relay needs its own.
	Owner string
	// BatchSize is how many rows one claim takes; default 100.
	BatchSize int
	// Window is the number of outstanding publisher confirms; default 256.
	Window int
	// PollInterval is how often the relay looks for rows without a
	// notification; default 1 s.
	PollInterval time.Duration
	// LeaseDuration is how long claimed rows are reserved for this relay;
	// default 30 s. It must cover publishing one batch: when it runs out
	// first, another relay may publish the same rows again (a duplicate,
	// never a loss). A crashed relay's rows wait this long.
	LeaseDuration time.Duration
	// ConfirmTimeout bounds the wait for the next publisher confirm;
	// default LeaseDuration/3. It must be shorter than LeaseDuration.
	ConfirmTimeout time.Duration
	// Logger receives errors and batch summaries; nil uses
	// Telemetry.Logger, then discards them.
	Logger *slog.Logger
	// Telemetry receives the relay's spans (one "send" span per publish,
	// a child of the row's traceparent) and metrics; the zero value
	// disables them.
	Telemetry telemetry.Providers
	// Now is the relay's clock (for deadlines and logs; leases use the
	// database clock so relays on skewed hosts agree); default time.Now.
	Now func() time.Time

	// afterPublish runs after a batch was published and before it is
	// marked. Tests use it to simulate a crash: a non-nil error makes Run
	// return it at once, leaving the rows leased and unmarked.
	afterPublish func(ids []int64) error
	// onListen runs each time the LISTEN connection is (re)established.
	onListen func()
}

func (c *RelayConfig) setDefaults() {
	if c.Owner == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.Window <= 0 {
		c.Window = 256
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 30 * time.Second
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = c.LeaseDuration / 3
	}
	c.Logger = c.Telemetry.LoggerOr(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *RelayConfig) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if c.Conn == nil {
		errs = append(errs, errors.New("Conn is required"))
	}
	if c.LeaseDuration < time.Millisecond {
		errs = append(errs, fmt.Errorf("LeaseDuration %v is below 1ms", c.LeaseDuration))
	}
	if c.ConfirmTimeout >= c.LeaseDuration {
		errs = append(errs, fmt.Errorf("ConfirmTimeout %v must be shorter than LeaseDuration %v", c.ConfirmTimeout, c.LeaseDuration))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox relay config: %w", err)
	}
	return nil
}

// Relay publishes committed outbox rows. See the package documentation for
// its design and guarantees.
type Relay struct {
	cfg RelayConfig
	pub *broker.Publisher
	tel relayTelemetry

	published, failed atomic.Int64
}

// RelayStats counts what a relay did since it was created.
type RelayStats struct {
	// Published counts rows this relay marked published.
	Published int64
	// Failed counts publishes that were not confirmed (nack, return,
	// timeout, connection loss) and were released for another attempt.
	Failed int64
}

// NewRelay validates cfg and returns a relay. Call Run to start it.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newRelayTelemetry(cfg.Telemetry)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: %w", err)
	}
	return &Relay{
		cfg: cfg,
		pub: broker.NewPublisher(cfg.Conn, broker.PublisherConfig{Window: cfg.Window, ConfirmTimeout: cfg.ConfirmTimeout}),
		tel: tel,
	}, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{Published: r.published.Load(), Failed: r.failed.Load()}
}

// Run relays until ctx is canceled, then finishes the batch in flight
// (publish, wait for confirms, mark) and returns nil. Database and broker
// errors are logged and retried with backoff; Run returns an error only for
// a simulated crash in tests.
func (r *Relay) Run(ctx context.Context) error {
	defer r.pub.Close()
	listenCtx, stopListen := context.WithCancel(ctx)
	wake := make(chan struct{}, 1)
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		r.listen(listenCtx, wake)
	}()
	defer func() {
		stopListen()
		<-listenDone
	}()

	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	failures := 0
	for {
		if ctx.Err() != nil {
			return nil
		}
		n, err := r.cycle(ctx)
		var crash *crashError
		switch {
		case errors.As(err, &crash):
			return crash.err
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			r.cfg.Logger.Error("outbox relay: batch failed", "owner", r.cfg.Owner, "error", err)
			wait := broker.Backoff(failures, 50*time.Millisecond, 5*time.Second)
			failures++
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		if n >= r.cfg.BatchSize {
			continue // probably more waiting
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		}
	}
}

type crashError struct{ err error }

func (e *crashError) Error() string { return e.err.Error() }

type row struct {
	id       int64
	attempts int32
	env      envelope.Envelope
}

// cycle claims one batch, publishes it and records the outcome. It returns
// the number of rows claimed.
func (r *Relay) cycle(ctx context.Context) (int, error) {
	rows, err := r.claim(ctx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	claimedAt := r.cfg.Now()
	// From here on the batch is finished even if ctx is canceled (drain),
	// bounded by the lease (after it, the rows are someone else's anyway)
	// and, once ctx is canceled, by ConfirmTimeout, so shutting down while
	// the broker is unreachable does not hang. Unfinished rows are simply
	// claimed again later.
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseDuration)
	defer cancel()
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ConfirmTimeout, cancel)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopGrace()

	out := make([]broker.Outgoing, len(rows))
	var spans []trace.Span
	if r.tel.tracer != nil {
		spans = make([]trace.Span, len(rows))
	}
	for i := range rows {
		rw := &rows[i]
		if spans != nil {
			spans[i] = r.tel.startSend(ctx, rw, r.cfg.Owner)
		}
		out[i] = broker.Outgoing{Exchange: rw.env.Exchange, RoutingKey: rw.env.RoutingKey, Publishing: rw.env.Publishing()}
	}
	errs := r.pub.Publish(work, out)
	if r.tel.metrics.Enabled() || spans != nil {
		now := time.Now()
		for i := range rows {
			var span trace.Span
			if spans != nil {
				span = spans[i]
			}
			r.tel.published(ctx, span, &rows[i], errs[i], now)
		}
	}

	if r.cfg.afterPublish != nil {
		ids := make([]int64, len(rows))
		for i, rw := range rows {
			ids[i] = rw.id
		}
		if err := r.cfg.afterPublish(ids); err != nil {
			return len(rows), &crashError{err: err}
		}
	}

	var done, failed, delays []int64
	for i, rw := range rows {
		if errs[i] == nil {
			done = append(done, rw.id)
			continue
		}
		failed = append(failed, rw.id)
		delays = append(delays, retryDelay(errs[i], rw.attempts).Milliseconds())
		r.cfg.Logger.Warn("outbox relay: publish failed; will retry",
			"owner", r.cfg.Owner, "message_id", rw.env.MessageID, "message_type", rw.env.MessageType,
			"exchange", rw.env.Exchange, "routing_key", rw.env.RoutingKey, "attempts", rw.attempts, "error", errs[i])
	}
	if err := r.settle(work, claimedAt, done, failed, delays); err != nil {
		return len(rows), err
	}
	r.cfg.Logger.Debug("outbox relay: batch done", "owner", r.cfg.Owner, "published", len(done), "failed", len(failed),
		"took", r.cfg.Now().Sub(claimedAt))
	return len(rows), nil
}

// retryDelay is how long a row whose publish failed waits before it can be
// claimed again. Nacks, returns and missing exchanges (a broker that
// refuses, a missing binding or exchange) back off exponentially with the
// row's attempts, so a row that cannot be routed does not spin;
// connection-level failures retry at once (the relay's own backoff and the
// Conn's reconnect pace those).
func retryDelay(err error, attempts int32) time.Duration {
	if !errors.Is(err, broker.ErrNacked) && !errors.Is(err, broker.ErrReturned) && !errors.Is(err, broker.ErrNoExchange) {
		return 0
	}
	return broker.Backoff(int(attempts)-1, 100*time.Millisecond, 30*time.Second)
}

const claimSQL = `
UPDATE saga_outbox
SET lease_owner = $1, lease_until = now() + $2 * interval '1 millisecond', attempts = attempts + 1
WHERE id IN (
  SELECT id FROM saga_outbox
  WHERE published_at IS NULL AND (lease_until IS NULL OR lease_until < now())
  ORDER BY id
  LIMIT $3
  FOR UPDATE SKIP LOCKED
)
RETURNING id, attempts, message_id, exchange, routing_key, message_type, schema_version,
  correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
  headers, body, occurred_at`

// claim leases up to BatchSize publishable rows to this relay, in one
// committed statement.
func (r *Relay) claim(ctx context.Context) ([]row, error) {
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.cfg.Owner, r.cfg.LeaseDuration.Milliseconds(), r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	var (
		out     []row
		rw      row
		headers []byte
	)
	e := &rw.env
	_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.attempts, &e.MessageID, &e.Exchange, &e.RoutingKey, &e.MessageType,
		&e.SchemaVersion, &e.CorrelationID, &e.CausationID, &e.SagaID, &e.SagaType, &e.IdempotencyKey,
		&e.Traceparent, &e.Tracestate, &headers, &e.Body, &e.OccurredAt}, func() error {
		e.Headers = nil
		if len(headers) > 0 && !bytes.Equal(headers, []byte("{}")) {
			dec := json.NewDecoder(bytes.NewReader(headers))
			dec.UseNumber() // keep integers integers
			if err := dec.Decode(&e.Headers); err != nil {
				// Enqueue writes only JSON objects; a row written by other
				// means is published without its extra headers rather than
				// blocking every row behind it.
				e.Headers = nil
				r.cfg.Logger.Error("outbox relay: headers are not a JSON object; publishing without them",
					"outbox_id", rw.id, "message_id", e.MessageID, "error", err)
			}
		}
		e.OccurredAt = e.OccurredAt.UTC()
		out = append(out, rw)
		return nil
	})
	if err != nil {
		// The lease runs out by itself; nothing to undo.
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	slices.SortFunc(out, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

const settleSQL = `
WITH done AS (
  UPDATE saga_outbox SET published_at = now(), lease_until = NULL
  WHERE id = ANY($1::bigint[]) AND published_at IS NULL
  RETURNING id
), released AS (
  UPDATE saga_outbox o SET lease_owner = NULL, lease_until = now() + f.delay * interval '1 millisecond'
  FROM unnest($2::bigint[], $3::bigint[]) AS f(id, delay)
  WHERE o.id = f.id AND o.lease_owner = $4 AND o.published_at IS NULL
  RETURNING o.id
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM released)`

// settle marks done rows published and releases failed rows, in one
// statement (one commit per batch). A row already marked by another relay
// (after our lease ran out) is not marked again; a failed row is released
// only while we still hold its lease. Database errors are retried until the
// lease would run out: giving up early only causes duplicates.
func (r *Relay) settle(ctx context.Context, claimedAt time.Time, done, failed, delays []int64) error {
	if done == nil {
		done = []int64{}
	}
	if failed == nil {
		failed, delays = []int64{}, []int64{}
	}
	deadline := claimedAt.Add(r.cfg.LeaseDuration)
	for attempt := 0; ; attempt++ {
		var marked, released int64
		err := r.cfg.Pool.QueryRow(ctx, settleSQL, done, failed, delays, r.cfg.Owner).Scan(&marked, &released)
		if err == nil {
			r.published.Add(marked)
			r.failed.Add(int64(len(failed)))
			return nil
		}
		wait := broker.Backoff(attempt, 20*time.Millisecond, time.Second)
		if r.cfg.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("mark %d outbox rows published and release %d (they will be published again): %w", len(done), len(failed), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
