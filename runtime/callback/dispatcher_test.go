package callback_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/callback/signature"
	"github.com/protosaga/saga/runtime/schema"
)

var testKeys = []signature.Key{
	{ID: "k2", Secret: []byte("second-secret-0123456789")},
	{ID: "k1", Secret: []byte("first-secret-0123456789")},
}

type testBundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(context.Background(), pool))
	return &testBundle{pool: pool}
}

// config is a dispatcher configuration fit for tests: loopback allowed,
// short waits.
func (b *testBundle) config() callback.Config {
	return callback.Config{
		Pool: b.pool, Keys: testKeys,
		AllowPrivate: callback.AllowPrivate{Loopback: true},
		Timeout:      2 * time.Second, Lease: 5 * time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Poll: 20 * time.Millisecond,
	}
}

// run starts a dispatcher until the test ends; stop stops it earlier.
func (b *testBundle) run(t *testing.T, cfg callback.Config, tweak ...func(*callback.Dispatcher)) (stop func()) {
	t.Helper()
	d, err := callback.NewDispatcher(cfg)
	require.NoError(t, err)
	for _, f := range tweak {
		f(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, d.Close())
		})
	}
	t.Cleanup(stop)
	return stop
}

// enqueue commits one callback to target (a URL, or "client:NAME") and
// returns its id.
func (b *testBundle) enqueue(t *testing.T, target string) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	d := callback.Delivery{Payload: callback.Payload{
		CallbackID: id, Event: callback.EventFor("COMPLETED"), SagaType: "shop.order.v1.PlaceOrder",
		SagaID: uuid.Must(uuid.NewV7()).String(), BusinessKey: "order-" + id[len(id)-6:], State: "COMPLETED",
		OccurredAt: time.Now().UTC(),
	}}
	if c, ok := strings.CutPrefix(target, "client:"); ok {
		d.Client = c
	} else {
		d.URL = target
	}
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return callback.EnqueueTx(context.Background(), tx, d)
	}))
	return id
}

func (b *testBundle) get(t *testing.T, id string) callback.Record {
	t.Helper()
	r, err := callback.Get(context.Background(), b.pool, id)
	require.NoError(t, err)
	return r
}

// waitStatus waits until the callback reaches status.
func (b *testBundle) waitStatus(t *testing.T, id string, status callback.Status) callback.Record {
	t.Helper()
	var r callback.Record
	require.Eventually(t, func() bool {
		r = b.get(t, id)
		return r.Status == status
	}, 30*time.Second, 10*time.Millisecond, "callback %s never became %s", id, status)
	return r
}

// receiver is a real HTTP receiver that verifies signatures and
// deduplicates by callback id; answer decides each request's response.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	answer func(n int, w http.ResponseWriter) bool // true: the request was processed

	mu        sync.Mutex
	requests  int
	byID      map[string]int // requests per callback id
	processed map[string]callback.Payload
	dupes     int
	badSig    int
	times     []time.Time
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter) bool) *receiver {
	r := &receiver{t: t, answer: answer, byID: map[string]int{}, processed: map[string]callback.Payload{}}
	v := signature.Verifier{Keys: testKeys[1:]} // the receiver knows only the older key
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id, body, err := v.VerifyRequest(req, 0)
		r.mu.Lock()
		r.requests++
		n := r.requests
		r.times = append(r.times, time.Now())
		if err != nil {
			r.badSig++
			r.mu.Unlock()
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		r.byID[id]++
		_, seen := r.processed[id]
		r.mu.Unlock()
		if seen {
			r.mu.Lock()
			r.dupes++
			r.mu.Unlock()
			w.WriteHeader(http.StatusOK) // deduplicated: acknowledged, no second effect
			return
		}
		if r.answer != nil && !r.answer(n, w) {
			return
		}
		var p callback.Payload
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.processed[id] = p
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) stats() (requests, processed, dupes, badSig int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, len(r.processed), r.dupes, r.badSig
}

func TestDeliversSignedOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	b.run(t, b.config())
	id := b.enqueue(t, rcv.srv.URL+"/hooks/order")
	rec := b.waitStatus(t, id, callback.StatusDelivered)
	require.Equal(t, 1, rec.Attempts)
	require.Equal(t, http.StatusNoContent, rec.LastStatus)
	req, processed, dupes, bad := rcv.stats()
	require.Equal(t, [4]int{1, 1, 0, 0}, [4]int{req, processed, dupes, bad})
	rcv.mu.Lock()
	p := rcv.processed[id]
	rcv.mu.Unlock()
	require.Equal(t, id, p.CallbackID)
	require.Equal(t, "saga.completed", p.Event)
	require.Equal(t, "COMPLETED", p.State)
}

func TestRolledBackOutcomeSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	b.run(t, b.config())
	errRollback := errors.New("the transition failed")
	err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		require.NoError(t, callback.EnqueueTx(context.Background(), tx, callback.Delivery{URL: rcv.srv.URL,
			Payload: callback.Payload{CallbackID: uuid.NewString(), SagaID: "s", Event: "saga.failed"}}))
		return errRollback
	})
	require.ErrorIs(t, err, errRollback)
	// Delivered after it: the dispatcher has passed over the table since.
	id := b.enqueue(t, rcv.srv.URL)
	b.waitStatus(t, id, callback.StatusDelivered)
	req, _, _, _ := rcv.stats()
	require.Equal(t, 1, req)
	all, err := callback.List(context.Background(), b.pool, callback.Filter{})
	require.NoError(t, err)
	require.Len(t, all, 1)
}

func TestSlowReceiverIsRetriedAfterTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	rcv := newReceiver(t, func(n int, w http.ResponseWriter) bool {
		if n == 1 {
			<-release // slower than the dispatcher's timeout
		}
		return true
	})
	t.Cleanup(func() { close(release) })
	cfg := b.config()
	cfg.Timeout = 300 * time.Millisecond
	b.run(t, cfg)
	id := b.enqueue(t, rcv.srv.URL)
	rec := b.waitStatus(t, id, callback.StatusDelivered)
	require.Equal(t, 2, rec.Attempts)
	require.Equal(t, 2, rcv.byIDCount(id))
}

func (r *receiver) byIDCount(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

func TestFailingReceiverParksWhenBudgetSpent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, func(_ int, w http.ResponseWriter) bool {
		http.Error(w, "database down", http.StatusServiceUnavailable)
		return false
	})
	cfg := b.config()
	cfg.MaxAttempts = 3
	b.run(t, cfg)
	id := b.enqueue(t, rcv.srv.URL)
	rec := b.waitStatus(t, id, callback.StatusParked)
	require.Equal(t, 3, rec.Attempts)
	require.Equal(t, 3, rcv.byIDCount(id))
	require.Equal(t, http.StatusServiceUnavailable, rec.LastStatus)
	require.Contains(t, rec.ParkReason, "retry budget spent: 3 attempts")
	require.Contains(t, rec.ParkReason, "HTTP 503: database down")
}

func TestAgeBudgetParks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, func(_ int, w http.ResponseWriter) bool {
		w.WriteHeader(http.StatusBadGateway)
		return false
	})
	cfg := b.config()
	cfg.MaxAge = time.Second
	cfg.MinBackoff, cfg.MaxBackoff = 2*time.Second, 2*time.Second
	b.run(t, cfg)
	id := b.enqueue(t, rcv.srv.URL)
	rec := b.waitStatus(t, id, callback.StatusParked)
	require.Equal(t, 1, rec.Attempts)
	require.Contains(t, rec.ParkReason, "after the callback was written (max 1s)")
}

func TestFlappingReceiverGetsEachOutcomeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, func(n int, w http.ResponseWriter) bool {
		if n%2 == 1 {
			http.Error(w, "flap", http.StatusInternalServerError)
			return false
		}
		return true
	})
	b.run(t, b.config())
	var ids []string
	for range 6 {
		ids = append(ids, b.enqueue(t, rcv.srv.URL))
	}
	for _, id := range ids {
		b.waitStatus(t, id, callback.StatusDelivered)
	}
	_, processed, _, bad := rcv.stats()
	require.Equal(t, 6, processed)
	require.Zero(t, bad)
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, func(n int, w http.ResponseWriter) bool {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return false
		}
		return true
	})
	b.run(t, b.config()) // backoff alone would wait at most 50 ms
	id := b.enqueue(t, rcv.srv.URL)
	b.waitStatus(t, id, callback.StatusDelivered)
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	require.Len(t, rcv.times, 2)
	require.GreaterOrEqual(t, rcv.times[1].Sub(rcv.times[0]), 2*time.Second-50*time.Millisecond,
		"the second attempt came before the receiver's Retry-After")
}

func TestClientErrorsArePermanentExcept408And429(t *testing.T) {
	t.Parallel()
	b := setup(t)
	statuses := map[string]int{"/404": 404, "/400": 400, "/301": 301, "/408": 408}
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		n := seen[r.URL.Path]
		mu.Unlock()
		if r.URL.Path == "/408" && n > 1 {
			w.WriteHeader(http.StatusOK)
			return
		}
		if statuses[r.URL.Path] == 301 {
			w.Header().Set("Location", "http://169.254.169.254/")
		}
		w.WriteHeader(statuses[r.URL.Path])
		_, _ = fmt.Fprintf(w, "answer for %s", r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	b.run(t, b.config())
	for path, want := range statuses {
		id := b.enqueue(t, srv.URL+path)
		if want == 408 {
			rec := b.waitStatus(t, id, callback.StatusDelivered)
			require.Equal(t, 2, rec.Attempts)
			continue
		}
		rec := b.waitStatus(t, id, callback.StatusParked)
		require.Equal(t, 1, rec.Attempts, path)
		require.Equal(t, fmt.Sprintf("HTTP %d: answer for %s", want, path), rec.ParkReason)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"/404": 1, "/400": 1, "/301": 1, "/408": 2}, seen)
}

func TestSSRFGuardRefusesLoopbackUnlessAllowed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	cfg := b.config()
	cfg.AllowPrivate = callback.AllowPrivate{}
	b.run(t, cfg)
	id := b.enqueue(t, rcv.srv.URL)
	rec := b.waitStatus(t, id, callback.StatusParked)
	require.Contains(t, rec.ParkReason, "loopback address 127.0.0.1")
	require.Contains(t, rec.ParkReason, "not allowed")
	local := b.enqueue(t, strings.Replace(rcv.srv.URL, "127.0.0.1", "localhost", 1))
	rec = b.waitStatus(t, local, callback.StatusParked)
	require.Contains(t, rec.ParkReason, "loopback address", "a name resolving to loopback is refused too")
	req, _, _, _ := rcv.stats()
	require.Zero(t, req)
}

func TestInvalidURLIsParkedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, "ftp://example.com/x")
	rec := b.get(t, id)
	require.Equal(t, callback.StatusParked, rec.Status)
	require.Contains(t, rec.ParkReason, "want an absolute http or https URL")
}

func TestCrashBetweenCommitAndDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	// Committed while no dispatcher runs (it crashed, or has not started).
	id := b.enqueue(t, rcv.srv.URL)
	require.Equal(t, callback.StatusPending, b.get(t, id).Status)
	b.run(t, b.config())
	b.waitStatus(t, id, callback.StatusDelivered)
	require.Equal(t, 1, rcv.byIDCount(id))
}

func TestCrashBetweenDeliveryAndRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	id := b.enqueue(t, rcv.srv.URL)
	cfg := b.config()
	cfg.Name = "crashing"
	cfg.Timeout, cfg.Lease = 300*time.Millisecond, 500*time.Millisecond
	crashed := make(chan struct{})
	var once sync.Once
	stopCrashing := b.run(t, cfg, func(d *callback.Dispatcher) {
		d.SetAfterSend(func(string) error {
			once.Do(func() { close(crashed) })
			return errors.New("crashed before recording")
		})
	})
	<-crashed
	stopCrashing()
	require.Equal(t, callback.StatusPending, b.get(t, id).Status)
	cfg.Name = "survivor"
	b.run(t, cfg)
	rec := b.waitStatus(t, id, callback.StatusDelivered)
	require.GreaterOrEqual(t, rec.Attempts, 2)
	req, processed, dupes, bad := rcv.stats()
	require.GreaterOrEqual(t, req, 2, "delivered again after the lease expired")
	require.Equal(t, 1, processed, "the receiver applied it once")
	require.Equal(t, req-1, dupes, "every further copy was deduplicated by id")
	require.Zero(t, bad)
}

func TestPerEndpointConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gate := make(chan struct{})
	var mu sync.Mutex
	inFlight, peak := 0, 0
	slow := newReceiver(t, func(int, http.ResponseWriter) bool {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		<-gate
		mu.Lock()
		inFlight--
		mu.Unlock()
		return true
	})
	fast := newReceiver(t, nil)
	cfg := b.config()
	cfg.PerEndpoint, cfg.Timeout, cfg.Lease = 2, 20*time.Second, 30*time.Second
	b.run(t, cfg)
	var slowIDs []string
	for range 6 {
		slowIDs = append(slowIDs, b.enqueue(t, slow.srv.URL))
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return inFlight == 2 }, 30*time.Second, 10*time.Millisecond)
	// The slow endpoint's backlog does not hold up another endpoint.
	fastID := b.enqueue(t, fast.srv.URL)
	b.waitStatus(t, fastID, callback.StatusDelivered)
	close(gate)
	for _, id := range slowIDs {
		b.waitStatus(t, id, callback.StatusDelivered)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, peak)
}

func TestClientEndpointAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t, nil)
	cfg := b.config()
	stop := b.run(t, cfg)
	ctx := context.Background()
	id := b.enqueue(t, "client:acme")
	rec := b.waitStatus(t, id, callback.StatusParked)
	require.Equal(t, `no endpoint registered for client "acme"`, rec.ParkReason)
	stop()

	require.ErrorIs(t, callback.Replay(ctx, b.pool, uuid.NewString(), "alice", "retry"), callback.ErrNotFound)
	require.Error(t, callback.Replay(ctx, b.pool, id, "", "no operator"))

	// The client registers; the operator replays the parked delivery.
	cfg.Clients = map[string]string{"acme": rcv.srv.URL + "/acme"}
	cfg.Name = "with-clients"
	b.run(t, cfg)
	require.NoError(t, callback.Replay(ctx, b.pool, id, "alice", "acme registered its endpoint"))
	rec = b.waitStatus(t, id, callback.StatusDelivered)
	require.Equal(t, 1, rcv.byIDCount(id))
	require.Empty(t, rec.ParkReason)
	require.ErrorIs(t, callback.Replay(ctx, b.pool, id, "alice", "again"), callback.ErrNotParked)
	audit, err := callback.Audit(ctx, b.pool, id)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "replay", audit[0].Action)
	require.Equal(t, "alice", audit[0].Operator)
	require.Equal(t, "acme registered its endpoint", audit[0].Reason)

	list, err := callback.List(ctx, b.pool, callback.Filter{SagaID: rec.SagaID})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, id, list[0].ID)
}
