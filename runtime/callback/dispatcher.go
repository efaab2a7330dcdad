package callback

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/callback/signature"
	"github.com/protosaga/saga/runtime/telemetry"
)

// Config configures a [Dispatcher]. Pool and Keys are required.
type Config struct {
	// Pool is the database holding saga_callback.
	Pool *pgxpool.Pool
	// Keys sign every delivery: the current key and, during a rotation,
	// the previous one (see package signature).
	Keys []signature.Key
	// Clients maps a client id (Saga.callback.client_field) to the URL of
	// its registered endpoint. A delivery for a client not listed is parked
	// with the reason; register the client and replay it.
	Clients map[string]string
	// Name identifies this dispatcher in leases. Default: host name, process
	// id and a random suffix.
	Name string
	// Workers bounds the requests in flight in this process. Default: 16.
	Workers int
	// PerEndpoint bounds the requests in flight to one endpoint (a URL's
	// scheme and host, or a client) in this process. Default: 4.
	PerEndpoint int
	// Timeout bounds one request, connection and response headers
	// included. Default: 10 s.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a retry: the n-th
	// retry waits a random time between half and all of
	// min(MaxBackoff, MinBackoff·2^(n-1)). Defaults: 1 s and 10 min.
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a receiver's Retry-After asks for.
	// Default: 1 h.
	MaxRetryAfter time.Duration
	// MaxAttempts and MaxAge are the retry budget: a delivery that failed
	// MaxAttempts times, or whose next attempt would fall more than MaxAge
	// after it was written, is parked. Defaults: 15 and 24 h.
	MaxAttempts int
	MaxAge      time.Duration
	// Lease is how long a claimed row is reserved for this dispatcher; a
	// dispatcher that dies holding it leaves the row to others after it.
	// Default: Timeout + 30 s.
	Lease time.Duration
	// Poll is how often the dispatcher looks for due rows when it has
	// nothing in flight. Default: 500 ms.
	Poll time.Duration
	// AllowPrivate opens address classes the SSRF guard refuses by
	// default (loopback, private, link-local).
	AllowPrivate AllowPrivate
	// TLS configures HTTPS requests (root CAs, client certificates).
	// Default: the system's roots.
	TLS *tls.Config
	// Now is the clock of signature timestamps. Default: time.Now.
	Now func() time.Time
	// Logger receives delivery logs. Default: Telemetry.Logger, then
	// slog.Default().
	Logger *slog.Logger
	// Telemetry receives the dispatcher's metrics.
	Telemetry telemetry.Providers
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = crand.Read(b[:])
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.PerEndpoint <= 0 {
		c.PerEndpoint = 4
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 10 * time.Minute
	}
	if c.MaxRetryAfter <= 0 {
		c.MaxRetryAfter = time.Hour
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 15
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.Lease <= 0 {
		c.Lease = c.Timeout + 30*time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 500 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = c.Telemetry.LoggerOr(c.Logger, slog.Default())
}

// Validate reports whether the configuration is usable. [NewDispatcher]
// calls it after applying defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if err := signature.ValidateKeys(c.Keys); err != nil {
		errs = append(errs, err)
	}
	for client, u := range c.Clients {
		if _, err := endpointKey(u); err != nil {
			errs = append(errs, fmt.Errorf("client %q: %w", client, err))
		}
	}
	if c.MinBackoff > c.MaxBackoff {
		errs = append(errs, fmt.Errorf("MinBackoff %s exceeds MaxBackoff %s", c.MinBackoff, c.MaxBackoff))
	}
	if c.Lease <= c.Timeout {
		errs = append(errs, fmt.Errorf("Lease %s must exceed Timeout %s", c.Lease, c.Timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("callback dispatcher config: %w", err)
	}
	return nil
}

// Dispatcher delivers saga_callback rows. Run any number of them, in any
// number of processes.
type Dispatcher struct {
	cfg     Config
	client  *http.Client
	metrics *metrics

	mu       sync.Mutex
	inFlight map[string]int // by endpoint key
	total    int
	done     chan struct{} // a delivery finished: claim again

	// afterSend, when set (tests), runs after a request was answered and
	// before its outcome is recorded; an error skips the record, as a
	// crash there would.
	afterSend func(id string) error
}

// NewDispatcher returns a dispatcher for cfg.
func NewDispatcher(cfg Config) (*Dispatcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Telemetry, cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("callback dispatcher metrics: %w", err)
	}
	transport := &http.Transport{
		DialContext:           cfg.AllowPrivate.dialer().DialContext,
		TLSClientConfig:       cfg.TLS,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   cfg.PerEndpoint,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &Dispatcher{
		cfg: cfg,
		client: &http.Client{
			Transport: transport,
			Timeout:   cfg.Timeout,
			// Redirects are not followed: a 3xx answer is permanent, and a
			// redirect could lead the request past the SSRF guard's intent.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		metrics:  m,
		inFlight: map[string]int{},
		done:     make(chan struct{}, 1),
	}, nil
}

// Close unregisters the dispatcher's gauges.
func (d *Dispatcher) Close() error { return d.metrics.close() }

// Run dispatches until ctx is done, then waits for the requests in flight
// to finish and records their outcome.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	work := context.WithoutCancel(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-d.done:
		}
		n, err := d.dispatchOnce(ctx, work, &wg)
		if err != nil && ctx.Err() == nil {
			d.cfg.Logger.Warn("claim callbacks", slog.String("dispatcher", d.cfg.Name), slog.Any("error", err))
		}
		wait := d.cfg.Poll
		if n > 0 && err == nil {
			wait = 0 // more may be due
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// claimed is one leased row.
type claimed struct {
	ID, SagaID, Event, URL, Client, Key string
	Body                                []byte
	Attempts                            int
	Age                                 time.Duration
}

const claimSQL = `
UPDATE saga_callback c SET lease_owner = $1, lease_until = now() + make_interval(secs => $2), attempts = c.attempts + 1
FROM (SELECT id FROM saga_callback
      WHERE delivered_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
        AND (lease_until IS NULL OR lease_until < now()) AND NOT (endpoint_key = ANY($3::text[]))
      ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) due
WHERE c.id = due.id
RETURNING c.id::text, c.saga_id, c.event, c.url, c.client, c.endpoint_key, c.body, c.attempts,
  EXTRACT(EPOCH FROM now() - c.budget_from)::float8`

const releaseSQL = `UPDATE saga_callback SET lease_owner = NULL, lease_until = NULL, attempts = attempts - 1
WHERE id = $1 AND lease_owner = $2`

// dispatchOnce claims what this process has room for and starts each
// delivery. It returns how many it started.
func (d *Dispatcher) dispatchOnce(ctx, work context.Context, wg *sync.WaitGroup) (int, error) {
	d.mu.Lock()
	free := d.cfg.Workers - d.total
	full := []string{} // never NULL: NOT (key = ANY(NULL)) excludes every row
	for k, n := range d.inFlight {
		if n >= d.cfg.PerEndpoint {
			full = append(full, k)
		}
	}
	d.mu.Unlock()
	if free <= 0 {
		return 0, nil
	}
	rows, err := d.cfg.Pool.Query(ctx, claimSQL, d.cfg.Name, d.cfg.Lease.Seconds(), full, free)
	if err != nil {
		return 0, fmt.Errorf("claim due callbacks: %w", err)
	}
	var batch []claimed
	for rows.Next() {
		var c claimed
		var age float64
		if err := rows.Scan(&c.ID, &c.SagaID, &c.Event, &c.URL, &c.Client, &c.Key, &c.Body, &c.Attempts, &age); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read claimed callback: %w", err)
		}
		c.Age = time.Duration(age * float64(time.Second))
		batch = append(batch, c)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("claim due callbacks: %w", err)
	}
	started := 0
	for _, c := range batch {
		d.mu.Lock()
		ok := d.inFlight[c.Key] < d.cfg.PerEndpoint
		if ok {
			d.inFlight[c.Key]++
			d.total++
		}
		d.mu.Unlock()
		if !ok {
			// One claim can return more rows of an endpoint than it has
			// room for: give the rest back untouched.
			if _, err := d.cfg.Pool.Exec(work, releaseSQL, c.ID, d.cfg.Name); err != nil {
				d.cfg.Logger.Warn("release callback", slog.String("callback_id", c.ID), slog.Any("error", err))
			}
			continue
		}
		started++
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.deliver(work, c)
			d.mu.Lock()
			d.inFlight[c.Key]--
			if d.inFlight[c.Key] == 0 {
				delete(d.inFlight, c.Key)
			}
			d.total--
			d.mu.Unlock()
			select {
			case d.done <- struct{}{}:
			default:
			}
		}()
	}
	return started, nil
}

// attempt is the outcome of one request.
type attempt struct {
	Status     int
	Err        string
	Permanent  bool
	RetryAfter time.Duration // >0: the receiver asked for it
}

// deliver sends one claimed row and records the outcome.
func (d *Dispatcher) deliver(ctx context.Context, c claimed) {
	log := d.cfg.Logger.With(slog.String("callback_id", c.ID), slog.String("saga_id", c.SagaID),
		slog.String("event", c.Event), slog.Int("attempt", c.Attempts))
	target := c.URL
	var a attempt
	if c.Client != "" {
		u, ok := d.cfg.Clients[c.Client]
		if !ok {
			a = attempt{Err: fmt.Sprintf("no endpoint registered for client %q", c.Client), Permanent: true}
		}
		target = u
	}
	start := time.Now()
	if a.Err == "" {
		a = d.send(ctx, c, target)
	}
	d.metrics.attempted(ctx, c.Event, a, time.Since(start))
	if d.afterSend != nil {
		if err := d.afterSend(c.ID); err != nil {
			log.Warn("callback outcome not recorded", slog.Any("error", err))
			return
		}
	}
	var err error
	switch {
	case a.Err == "":
		err = d.record(ctx, `UPDATE saga_callback SET delivered_at = now(), last_status = $3, last_error = '',
  lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2`, c.ID, a.Status)
		if err == nil {
			d.metrics.delivered(ctx, c.Event)
			log.Debug("callback delivered", slog.Int("status", a.Status))
		}
	case a.Permanent:
		err = d.park(ctx, c, a, a.Err)
	default:
		wait := d.backoff(c.Attempts)
		if a.RetryAfter > 0 {
			wait = min(a.RetryAfter, d.cfg.MaxRetryAfter)
		}
		switch {
		case c.Attempts >= d.cfg.MaxAttempts:
			err = d.park(ctx, c, a, fmt.Sprintf("retry budget spent: %d attempts; last: %s", c.Attempts, a.Err))
		case c.Age+wait > d.cfg.MaxAge:
			err = d.park(ctx, c, a, fmt.Sprintf("retry budget spent: next attempt would be %s after the callback was written (max %s); last: %s",
				(c.Age+wait).Round(time.Second), d.cfg.MaxAge, a.Err))
		default:
			err = d.record(ctx, `UPDATE saga_callback SET next_attempt_at = now() + make_interval(secs => $3),
  last_status = $4, last_error = $5, lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2`,
				c.ID, wait.Seconds(), a.Status, a.Err)
			if err == nil {
				log.Info("callback will be retried", slog.Int("status", a.Status), slog.String("error", a.Err), slog.Duration("wait", wait))
			}
		}
	}
	if err != nil {
		log.Error("record callback outcome", slog.Any("error", err))
	}
}

func (d *Dispatcher) park(ctx context.Context, c claimed, a attempt, reason string) error {
	err := d.record(ctx, `UPDATE saga_callback SET parked_at = now(), park_reason = $3, last_status = $4, last_error = $5,
  lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2`, c.ID, reason, a.Status, a.Err)
	if err == nil {
		d.metrics.parked(ctx, c.Event)
		d.cfg.Logger.Warn("callback parked", slog.String("callback_id", c.ID), slog.String("saga_id", c.SagaID),
			slog.String("reason", reason))
	}
	return err
}

// record runs one outcome update guarded by this dispatcher's lease. A
// lease lost meanwhile (it expired and another dispatcher took the row)
// changes nothing: the other dispatcher's attempt decides.
func (d *Dispatcher) record(ctx context.Context, sql string, id string, args ...any) error {
	tag, err := d.cfg.Pool.Exec(ctx, sql, append([]any{id, d.cfg.Name}, args...)...)
	if err != nil {
		return fmt.Errorf("record callback %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		d.cfg.Logger.Warn("callback lease lost before its outcome was recorded", slog.String("callback_id", id))
	}
	return nil
}

// backoff returns the wait after failed attempt n (1 = the first).
func (d *Dispatcher) backoff(n int) time.Duration {
	ceil := d.cfg.MaxBackoff
	if n-1 < 40 {
		ceil = min(ceil, d.cfg.MinBackoff<<(n-1))
	}
	half := ceil / 2
	return half + time.Duration(rand.Int64N(int64(ceil-half)+1))
}

// send POSTs the body once and classifies the answer.
func (d *Dispatcher) send(ctx context.Context, c claimed, target string) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(c.Body))
	if err != nil {
		return attempt{Err: fmt.Sprintf("build request: %v", err), Permanent: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "protosaga-callback/1")
	signature.SetHeaders(req.Header, c.ID, d.cfg.Keys, d.cfg.Now(), c.Body)
	resp, err := d.client.Do(req)
	if err != nil {
		if errors.Is(err, errForbiddenTarget) {
			return attempt{Err: err.Error(), Permanent: true}
		}
		// Anything else — a timeout, a refused connection, a name that
		// does not resolve (yet) — is retried within the budget.
		return attempt{Err: err.Error()}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	a := attempt{Status: resp.StatusCode}
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return a
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		a.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	default:
		a.Permanent = true
	}
	a.Err = fmt.Sprintf("HTTP %d", resp.StatusCode)
	if t := strings.TrimSpace(string(snippet)); t != "" {
		a.Err += ": " + strings.ToValidUTF8(t, "?")
	}
	return a
}

// retryAfter parses a Retry-After value (seconds or an HTTP date); 0 when
// absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, 1<<32)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
