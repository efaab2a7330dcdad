package host_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/telemetry"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	cfg, err := host.FromEnv(env(map[string]string{
		host.EnvPostgresURL: "postgres://db/x", host.EnvAMQPURL: "amqp://mq/", host.EnvService: "orders",
		host.EnvHTTPAddr: "127.0.0.1:9000", host.EnvAdminTokens: "ops:repair:0123456789abcdef0123",
		host.EnvQueueType: "classic", host.EnvRelays: "0", host.EnvConcurrency: "8", host.EnvMigrate: "false", host.EnvStart: "true",
		host.EnvLogLevel: "warn", host.EnvLogFormat: "text",
	}))
	require.NoError(t, err)
	require.Equal(t, "postgres://db/x", cfg.PostgresURL)
	require.Equal(t, "amqp://mq/", cfg.AMQPURL)
	require.Equal(t, "orders", cfg.Service)
	require.Equal(t, "127.0.0.1:9000", cfg.HTTPAddr)
	require.Len(t, cfg.AdminTokens, 1)
	require.Equal(t, broker.QueueClassic, cfg.QueueType)
	require.Equal(t, host.NoRelays, cfg.Relays, "SAGA_RELAYS=0 runs no relay")
	require.Equal(t, 8, cfg.Concurrency)
	require.True(t, cfg.SkipMigrations)
	require.True(t, cfg.StartEndpoints)
	require.False(t, cfg.Logger.Enabled(context.Background(), slog.LevelInfo))

	_, err = host.FromEnv(env(map[string]string{
		host.EnvRelays: "-1", host.EnvConcurrency: "x", host.EnvMigrate: "perhaps", host.EnvLogLevel: "loud",
		host.EnvLogFormat: "xml", host.EnvAdminTokens: "nonsense", host.EnvStart: "sometimes",
	}))
	for _, want := range []string{"SAGA_HTTP_START", "SAGA_RELAYS", "SAGA_CONCURRENCY", "SAGA_MIGRATE", "SAGA_LOG_LEVEL", "SAGA_LOG_FORMAT", "SAGA_ADMIN_TOKENS"} {
		require.ErrorContains(t, err, want)
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := host.New(ctx, host.Config{})
	require.ErrorContains(t, err, "no database: set SAGA_PG_URL")
	require.ErrorContains(t, err, "no broker: set SAGA_AMQP_URL")
	_, err = host.New(ctx, host.Config{PostgresURL: "postgres://db/x", AMQPURL: "amqp://mq/", HTTPAddr: "nowhere",
		QueueType: "stream", Retry: retry.Policy{Tiers: []time.Duration{-time.Second}, MaxAttempts: 1}})
	require.ErrorContains(t, err, `HTTP address "nowhere"`)
	require.ErrorContains(t, err, `queue type "stream"`)
	require.ErrorContains(t, err, "retry policy")
	_, err = host.New(ctx, host.Config{PostgresURL: "postgres://user:secret@db:notaport/x", AMQPURL: "amqp://mq/"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

// TestDefaultPoolSize: a pool the host opens itself holds at most 4
// connections per relay, Concurrency+1 for each of eight consumers and 4
// more, unless the URL sets pool_max_conns.
func TestDefaultPoolSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		url                 string
		relays, concurrency int
		want                int32
	}{
		{"postgres://db/x", 0, 0, 4 + 8*5 + 4},
		{"postgres://db/x", 2, 8, 2*4 + 8*9 + 4},
		{"postgres://db/x?pool_max_conns=7", 0, 0, 7},
	} {
		h, err := host.New(ctx, host.Config{PostgresURL: c.url, AMQPURL: "amqp://mq/", HTTPAddr: host.HTTPOff,
			Relays: c.relays, Concurrency: c.concurrency})
		require.NoError(t, err)
		require.Equal(t, c.want, h.Pool().Config().MaxConns, "%+v", c)
		h.Close()
	}
}

// TestRegistrationErrors: a queue registered twice, a nil implementation and
// a registration after Start are refused, and Start refuses a host whose
// registrations failed even when the caller dropped the error.
func TestRegistrationErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h, err := host.New(ctx, host.Config{PostgresURL: "postgres://db/x", AMQPURL: "amqp://mq/", HTTPAddr: host.HTTPOff})
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
	err = inventoryv1.RegisterInventoryParticipant(h, app.Inventory{})
	require.ErrorContains(t, err, "queue inventory.commands is already consumed by participant inventory")
	require.ErrorContains(t, inventoryv1.RegisterInventoryParticipant(h, nil), "participant is nil")
	_, err = orderv1.RegisterPlaceOrder(h, nil)
	require.ErrorContains(t, err, "decider is nil")
	err = h.Start(ctx)
	require.ErrorContains(t, err, "already consumed", "a dropped registration error still stops Start")

	empty, err := host.New(ctx, host.Config{PostgresURL: "postgres://db/x", AMQPURL: "amqp://mq/", HTTPAddr: host.HTTPOff, Relays: host.NoRelays})
	require.NoError(t, err)
	require.ErrorContains(t, empty.Start(ctx), "nothing to run")
}

// TestHostServes runs the Place Order example on a host and checks what it
// serves: liveness, readiness, metrics, saga status by the start endpoint's
// URL, and the admin API only with a token; then that Stop turns readiness
// off and releases the port.
func TestHostServes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	logs := &testenv.LogBuffer{}
	h, err := host.New(ctx, host.Config{
		Service: "host-test", Pool: pool, AMQPURL: testenv.AMQP(t), HTTPAddr: "127.0.0.1:0",
		AdminTokens: mustTokens(t, "ops:read:0123456789abcdef0123"), StartEndpoints: true,
		Logger: slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}), telemetry.LogOptions{})),
	})
	require.NoError(t, err)
	po, err := app.Register(h)
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, h.Stop(ctx))
		}
	})
	base := "http://" + h.Addr()
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, _ := get("/healthz", "")
	require.Equal(t, http.StatusOK, code)
	code, body := get("/readyz", "")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get("/metrics", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "saga_instances", "the saga gauges are exported")
	require.Contains(t, body, `target_info{service_name="host-test"`, "the service by its name")
	require.NotContains(t, body, "unknown_service")
	for _, m := range []string{"go_goroutines ", "go_memstats_heap_alloc_bytes ", "process_resident_memory_bytes ", "process_cpu_seconds_total "} {
		require.Contains(t, body, m, "the Go runtime's and the process's metrics")
	}
	code, _ = get("/admin/api/sagas", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body = get("/admin/api/sagas", "0123456789abcdef0123")
	require.Equal(t, http.StatusOK, code, body)

	require.NoError(t, app.Restock(ctx, pool, "widget", 10))
	reqBody := `{"orderId":"o-http","customerId":"c","lines":[{"productId":"widget","quantity":1}],` +
		`"amount":{"currency":"EUR","minorUnits":100},"shippingAddress":{"country":"FR"},"cardToken":"tok"}`
	resp, err := http.Post(base+"/sagas/place_order", "application/json", strings.NewReader(reqBody))
	require.NoError(t, err)
	var started struct {
		SagaID    string `json:"sagaId"`
		StatusURL string `json:"statusUrl"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, "/sagas/place_order/"+started.SagaID, started.StatusURL)
	code, body = get(started.StatusURL, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, started.SagaID, "the status URL the start endpoint returned answers")
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := po.GetByID(ctx, started.SagaID)
		require.NoError(t, err)
		if st.State == orderv1.PlaceOrderStateCompleted {
			break
		}
		require.True(t, time.Now().Before(deadline), "saga %s still in %s", started.SagaID, st.State)
		time.Sleep(50 * time.Millisecond)
	}

	// Without a tracer of its own, the saga still has one trace id: in each
	// of its messages and in the log lines about them.
	rows, err := pool.Query(ctx, `SELECT DISTINCT substr(traceparent, 4, 32) FROM saga_outbox WHERE saga_id = $1`, started.SagaID)
	require.NoError(t, err)
	traces, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, traces, 1, "one trace per saga")
	require.Len(t, traces[0], 32)
	var logged int
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"saga_id":"`+started.SagaID+`"`) {
			require.Contains(t, line, `"trace_id":"`+traces[0]+`"`, "a log line about the saga without its trace id: %s", line)
			logged++
		}
	}
	require.Positive(t, logged)

	// A saga started from application code completes too, its first
	// command handed to the host's relay (examples/placeorder/app
	// TestStartHandsFirstCommandToTheRelay checks the hand-over itself).
	id, created, err := po.Start(ctx, &orderv1.PlaceOrderRequest{
		OrderId: "o-app", CustomerId: "c", Lines: []*commonv1.OrderLine{{ProductId: "widget", Quantity: 1}},
		Amount: &commonv1.Money{Currency: "EUR", MinorUnits: 100}, ShippingAddress: &commonv1.Address{Country: "FR"}, CardToken: "tok",
	}, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	for {
		st, err := po.GetByID(ctx, id)
		require.NoError(t, err)
		if st.State == orderv1.PlaceOrderStateCompleted {
			break
		}
		require.True(t, time.Now().Before(deadline), "saga %s still in %s", id, st.State)
		time.Sleep(50 * time.Millisecond)
	}

	addr := h.Addr()
	require.NoError(t, h.Stop(ctx))
	stopped = true
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "Stop released the port")
	require.NoError(t, ln.Close())
	require.NoError(t, h.Stop(ctx), "a second Stop is a no-op")
}

// TestStartFailsCleanly: a taken HTTP port fails Start after the broker
// connections were made; nothing keeps running, and the host cannot be
// started again.
func TestStartFailsCleanly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	amqpURL := testenv.AMQP(t)
	h, err := host.New(ctx, host.Config{
		Pool: testenv.Postgres(t), AMQPURL: amqpURL, HTTPAddr: ln.Addr().String(), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	_, err = app.Register(h)
	require.NoError(t, err)
	err = h.Start(ctx)
	require.ErrorContains(t, err, "HTTP server")
	require.ErrorContains(t, err, "address already in use")
	require.Eventually(t, func() bool { return testenv.AMQPConnections(t, amqpURL) == 0 }, 20*time.Second, 200*time.Millisecond,
		"the broker connections Start made are closed")
	require.ErrorContains(t, h.Start(ctx), "already started")
}

// TestMainContext runs a service the way host.Main does, from the
// environment, until its context ends.
func TestMainContext(t *testing.T) {
	t.Parallel()
	pgURL, amqpURL := testenv.PostgresURL(t), testenv.AMQP(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	registered := make(chan *host.Host, 1)
	go func() {
		done <- host.MainContext(ctx, env(map[string]string{
			host.EnvPostgresURL: pgURL, host.EnvAMQPURL: amqpURL, host.EnvHTTPAddr: "127.0.0.1:0", host.EnvLogLevel: "error",
		}), func(h *host.Host) error {
			registered <- h
			_, err := app.Register(h)
			return err
		})
	}()
	h := <-registered
	require.Eventually(t, func() bool { return h.Addr() != "" }, 30*time.Second, 50*time.Millisecond, "the host starts")
	resp, err := http.Get("http://" + h.Addr() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("MainContext did not return after its context ended")
	}

	err = host.MainContext(context.Background(), env(map[string]string{
		host.EnvPostgresURL: pgURL, host.EnvAMQPURL: amqpURL, host.EnvHTTPAddr: host.HTTPOff,
	}), func(*host.Host) error { return io.ErrUnexpectedEOF })
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.ErrorContains(t, err, "register")
}

func mustTokens(t *testing.T, spec string) admin.Tokens {
	t.Helper()
	tokens, err := admin.ParseTokens(spec)
	require.NoError(t, err)
	return tokens
}

// TestMainOverTLS: a service configured from the environment reaches
// PostgreSQL with verify-full and RabbitMQ over amqps:// against a private
// CA (SAGA_AMQP_CA).
func TestMainOverTLS(t *testing.T) {
	t.Parallel()
	pgURL, amqpsURL := testenv.PostgresTLSURL(t), testenv.AMQPSURL(t)
	ca := os.Getenv(testenv.EnvTLSCA)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	registered := make(chan *host.Host, 1)
	go func() {
		done <- host.MainContext(ctx, env(map[string]string{
			host.EnvPostgresURL: pgURL, host.EnvAMQPURL: amqpsURL, host.EnvAMQPCA: ca,
			host.EnvHTTPAddr: "127.0.0.1:0", host.EnvLogLevel: "error",
		}), func(h *host.Host) error {
			registered <- h
			_, err := app.Register(h)
			return err
		})
	}()
	h := <-registered
	require.Eventually(t, func() bool { return h.Addr() != "" }, 30*time.Second, 50*time.Millisecond, "the host starts over TLS")
	cancel()
	require.NoError(t, <-done)

	_, err := host.FromEnv(env(map[string]string{host.EnvAMQPCA: "/nonexistent/ca.pem"}))
	require.ErrorContains(t, err, "SAGA_AMQP_CA")
}

// TestAdminTokensReload: the admin tokens come from a file that the host
// reads again when it changes (and on ReloadAdminTokens): a rotated token
// works without a restart, the old one no longer does, and a file that no
// longer parses keeps the tokens in use.
func TestAdminTokensReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "tokens")
	const first, second = "first-token-0123456789abcdef", "second-token-0123456789abcdef"
	require.NoError(t, os.WriteFile(file, []byte("ops:repair:"+first+"\n"), 0o600))
	logs := &testenv.LogBuffer{}
	h, err := host.New(ctx, host.Config{
		Service: "host-tokens", Pool: testenv.Postgres(t), AMQPURL: testenv.AMQP(t), HTTPAddr: "127.0.0.1:0",
		AdminTokensFile: file, AdminTokensCheck: 20 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
	_, err = orderv1.RegisterPlaceOrder(h, app.Decider{})
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() { require.NoError(t, h.Stop(ctx)) })
	whoami := func(token string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.Addr()+"/admin/api/whoami", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, whoami(first))

	// Rotated in place: the host sees the change.
	require.NoError(t, os.WriteFile(file, []byte("ops:repair:"+second+"\n"), 0o600))
	require.Eventually(t, func() bool { return whoami(second) == http.StatusOK }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusUnauthorized, whoami(first))

	// Rotated again to a token of the same length, with the modification
	// time put back: the content differs, so the host still sees it.
	fi, err := os.Stat(file)
	require.NoError(t, err)
	const third = "third-token-0123456789abcdefg"
	require.Len(t, third, len(second))
	require.NoError(t, os.WriteFile(file, []byte("ops:repair:"+third+"\n"), 0o600))
	require.NoError(t, os.Chtimes(file, fi.ModTime(), fi.ModTime()))
	require.Eventually(t, func() bool { return whoami(third) == http.StatusOK }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusUnauthorized, whoami(second))

	// A broken file: refused, logged, the tokens in use stay.
	require.NoError(t, os.WriteFile(file, []byte("ops:repair:short\n"), 0o600))
	require.Error(t, h.ReloadAdminTokens())
	require.Equal(t, http.StatusOK, whoami(third))
	require.NotEmpty(t, logs.Records(t, "admin tokens not reloaded; the tokens in use stay"))
	require.NotContains(t, logs.String(), third, "tokens are never logged")

	_, err = host.FromEnv(env(map[string]string{host.EnvAdminTokens: "ops:read:0123456789abcdef0123", host.EnvAdminTokensFile: file}))
	require.ErrorContains(t, err, "not both")
}
