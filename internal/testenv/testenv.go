// Package testenv gives integration tests an isolated slice of the real
// PostgreSQL and RabbitMQ that scripts/services.sh starts: a fresh schema per
// call and a fresh vhost per call, so tests run in parallel and never see each
// other's rows or queues.
//
// The servers' addresses come from the environment, under the names
// scripts/services.sh writes into its env.sh and the runtime's examples read:
//
//	SAGA_PG_URL     base PostgreSQL URL (database "saga")
//	SAGA_AMQP_URL   base AMQP URL (vhost "/")
//	SAGA_RABBIT_API RabbitMQ management API base URL with credentials
//
// `make test` runs the tests under scripts/with-services.sh, which sets them
// to servers services.sh started, whatever the caller's environment holds. A
// plain `go test` uses the servers they name: tests create and drop schemas
// and vhosts of their own there.
//
// When a variable is missing, the test fails under CI=true and is skipped with
// the command to run otherwise. A variable that is set but whose server does
// not answer always fails the test.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/internal/rabbitapi"
)

// Environment variable names.
const (
	EnvPostgresURL = "SAGA_PG_URL"
	EnvAMQPURL     = "SAGA_AMQP_URL"
	EnvRabbitAPI   = "SAGA_RABBIT_API"
)

const howTo = "run `make test`, or start services with `scripts/services.sh start /tmp/saga-services && source /tmp/saga-services/env.sh`"

// require returns the value of the environment variable name, failing the
// test under CI and skipping it otherwise when it is unset.
func require(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: CI must start PostgreSQL and RabbitMQ (%s)", name, howTo)
	}
	t.Skipf("%s is not set; this test needs a real server: %s", name, howTo)
	return ""
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// uniqueName returns a short, unique, identifier-safe name derived from the
// test name.
func uniqueName(t testing.TB) string {
	base := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 30 {
		base = base[len(base)-30:]
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random name: %v", err)
	}
	return "t_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(b[:])
}

var (
	adminOnce sync.Once
	adminPool *pgxpool.Pool
	adminErr  error
)

// admin returns a process-wide pool on the base database, used to create and
// drop schemas.
func admin(t testing.TB) *pgxpool.Pool {
	t.Helper()
	base := require(t, EnvPostgresURL)
	adminOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		adminPool, adminErr = pgxpool.New(ctx, base)
		if adminErr == nil {
			adminErr = adminPool.Ping(ctx)
		}
	})
	if adminErr != nil {
		t.Fatalf("testenv: PostgreSQL at %s does not answer: %v (%s)", redact(base), adminErr, howTo)
	}
	return adminPool
}

// PostgresURL creates a fresh schema and returns a connection URL whose
// search_path is that schema and whose application_name is the schema's name.
// The schema is dropped when the test ends.
func PostgresURL(t testing.TB) string {
	t.Helper()
	pool := admin(t)
	schema := uniqueName(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("testenv: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()", schema)
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(os.Getenv(EnvPostgresURL))
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvPostgresURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres returns a pool whose connections use a fresh schema (see
// PostgresURL). The pool is closed and the schema dropped when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse pool config: %v", err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testenv: open pool: %v", err)
	}
	t.Cleanup(func() { closePool(t, pool) }) // runs before the schema drop registered earlier
	return pool
}

// closePool closes a test's pool, which waits for every acquired connection
// to be released. A test that failed while it held one (rows left open by a
// failed require in a loop over them, a transaction never ended) would hang
// there until the test binary's timeout; after 30 s the test fails with the
// count instead, and the schema drop that follows terminates the connections.
func closePool(t testing.TB, pool *pgxpool.Pool) {
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Errorf("testenv: the test's pool did not close within 30 s: %d connection(s) still acquired (rows not closed? a transaction not ended?)",
			pool.Stat().AcquiredConns())
	}
}

// KillPostgresConnections terminates every backend connected for the schema of
// pool (by application_name), as a database restart would. It returns how many
// backends were terminated.
func KillPostgresConnections(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	if app == "" {
		t.Fatalf("testenv: pool has no application_name; use testenv.Postgres")
	}
	var n int
	err := admin(t).QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`,
		app).Scan(&n)
	if err != nil {
		t.Fatalf("testenv: terminate backends of %s: %v", app, err)
	}
	return n
}

// WaitBlocked waits until a statement of pool's connections (by
// application_name, so never another test's) whose text matches the LIKE
// pattern waits for a lock, and fails the test after 10 s.
func WaitBlocked(t testing.TB, pool *pgxpool.Pool, pattern string) {
	t.Helper()
	app := pool.Config().ConnConfig.RuntimeParams["application_name"]
	if app == "" {
		t.Fatalf("testenv: pool has no application_name; use testenv.Postgres")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE $2)`, app, pattern).Scan(&waiting)
		switch {
		case err != nil:
			t.Fatalf("testenv: look for a blocked statement like %q: %v", pattern, err)
		case waiting:
			return
		case time.Now().After(deadline):
			t.Fatalf("testenv: no statement like %q waited for a lock within 10 s", pattern)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rabbitAPI performs a management API call on the shared services (path is
// already escaped, e.g. "/vhosts/"+url.PathEscape(name)) and decodes a JSON
// answer into out when out is not nil.
func rabbitAPI(ctx context.Context, method, path string, body any, out any) error {
	return rabbitapi.Call(ctx, os.Getenv(EnvRabbitAPI), method, path, body, out)
}

// AMQP creates a fresh vhost, grants the base URL's user every permission on
// it, and returns an AMQP URL for it. The vhost (with its queues and
// exchanges) is deleted when the test ends.
func AMQP(t testing.TB) string {
	t.Helper()
	base := require(t, EnvAMQPURL)
	require(t, EnvRabbitAPI)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvAMQPURL, err)
	}
	vhost := uniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rabbitAPI(ctx, http.MethodPut, "/vhosts/"+url.PathEscape(vhost), nil, nil); err != nil {
		t.Fatalf("testenv: RabbitMQ management API does not answer (%s): %v", howTo, err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := rabbitAPI(ctx, http.MethodPut, "/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), perm, nil); err != nil {
		t.Fatalf("testenv: grant permissions on vhost %s: %v", vhost, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitAPI(ctx, http.MethodDelete, "/vhosts/"+url.PathEscape(vhost), nil, nil); err != nil {
			t.Logf("testenv: delete vhost %s: %v", vhost, err)
		}
	})
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return u.String()
}

// VHost returns the vhost named by an AMQP URL.
func VHost(amqpURL string) (string, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", err
	}
	v := strings.TrimPrefix(u.Path, "/")
	if v == "" {
		v = "/"
	}
	return v, nil
}

// KillAMQPConnections force-closes every client connection on the vhost of
// amqpURL through the management API, as a broker restart or network cut
// would. It waits up to 10 s for at least one connection to be visible and
// returns how many it closed.
func KillAMQPConnections(t testing.TB, amqpURL string) int {
	t.Helper()
	vhost, err := VHost(amqpURL)
	if err != nil {
		t.Fatalf("testenv: vhost of %s: %v", redact(amqpURL), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []struct {
		Name string `json:"name"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		conns = conns[:0]
		if err := rabbitAPI(ctx, http.MethodGet, "/vhosts/"+url.PathEscape(vhost)+"/connections", nil, &conns); err != nil {
			t.Fatalf("testenv: list connections of vhost %s: %v", vhost, err)
		}
		if len(conns) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	n := 0
	for _, c := range conns {
		err := rabbitAPI(ctx, http.MethodDelete, "/connections/"+url.PathEscape(c.Name), nil, nil)
		if err != nil && !strings.Contains(err.Error(), "404") {
			t.Fatalf("testenv: close connection %q: %v", c.Name, err)
		}
		n++
	}
	return n
}

// KillAMQPConnectionsUntil kills the vhost's client connections until closed
// yields, and fails the test if it has not after 30 s. The management API's
// list lags: right after a reconnect it can still name only the connection
// killed before, so a single kill may miss the one a test waits on.
func KillAMQPConnectionsUntil[T any](t testing.TB, amqpURL string, closed <-chan T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		KillAMQPConnections(t, amqpURL)
		wait := time.NewTimer(2 * time.Second)
		select {
		case <-closed:
			wait.Stop()
			return
		case <-wait.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: the connection was not closed after killing the connections of %s for 30s", redact(amqpURL))
		}
	}
}

// AMQPConnections returns how many client connections the management API
// lists on the vhost of amqpURL (its view lags by up to a few seconds).
func AMQPConnections(t testing.TB, amqpURL string) int {
	t.Helper()
	vhost, err := VHost(amqpURL)
	if err != nil {
		t.Fatalf("testenv: vhost of %s: %v", redact(amqpURL), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []struct {
		Name string `json:"name"`
	}
	if err := rabbitAPI(ctx, http.MethodGet, "/vhosts/"+url.PathEscape(vhost)+"/connections", nil, &conns); err != nil {
		t.Fatalf("testenv: list connections of vhost %s: %v", vhost, err)
	}
	return len(conns)
}

// QueueDepth returns the number of ready messages in queue on the vhost of
// amqpURL, as the management API reports it (it lags by up to a second).
func QueueDepth(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	return queueStats(t, amqpURL, queue).Messages
}

// QueueConsumers returns how many consumers queue has on amqpURL's vhost,
// through the management API.
func QueueConsumers(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	return queueStats(t, amqpURL, queue).Consumers
}

type queueCounts struct {
	Messages  int `json:"messages"`
	Consumers int `json:"consumers"`
}

func queueStats(t testing.TB, amqpURL, queue string) queueCounts {
	t.Helper()
	vhost, err := VHost(amqpURL)
	if err != nil {
		t.Fatalf("testenv: vhost of %s: %v", redact(amqpURL), err)
	}
	var q queueCounts
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rabbitAPI(ctx, http.MethodGet, "/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(queue), nil, &q); err != nil {
		t.Fatalf("testenv: queue %s: %v", queue, err)
	}
	return q
}

// redact hides the password of a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	return u.Redacted()
}

// ArrayLiteral is a SQL array literal of elems, as GenericPlan takes its
// arguments: ArrayLiteral("a", "b") is '{a,b}'. Elements are written as
// given (quote one that needs it: `"two words"`).
func ArrayLiteral(elems ...string) string {
	return "'{" + strings.Join(elems, ",") + "}'"
}

// GenericPlan runs query under the generic plan, the plan a statement
// prepared by pgx settles on after five executions and keeps while tables
// grow, and returns its EXPLAIN ANALYZE (so the statement is executed, in a
// transaction of its own). args are the values of its parameters as SQL
// literals ('2030-01-02T03:04:05Z', 100, '{A,B}'); the parameters' types are
// inferred from the query.
func GenericPlan(t testing.TB, pool *pgxpool.Pool, query string, args ...string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("testenv: generic plan: %v", err)
	}
	defer conn.Release()
	// The setting and the statement stay on this connection; they are
	// undone one at a time, so that a DEALLOCATE that fails (the PREPARE
	// did) does not roll the RESET back with it.
	defer conn.Exec(ctx, `RESET plan_cache_mode`)   //nolint:errcheck // see above
	defer conn.Exec(ctx, `DEALLOCATE generic_plan`) //nolint:errcheck // see above
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatalf("testenv: generic plan: %v", err)
	}
	if _, err := conn.Exec(ctx, `PREPARE generic_plan AS `+query); err != nil {
		t.Fatalf("testenv: generic plan: prepare: %v\n%s", err, query)
	}
	rows, err := conn.Query(ctx, `EXPLAIN ANALYZE EXECUTE generic_plan(`+strings.Join(args, ", ")+`)`)
	if err != nil {
		t.Fatalf("testenv: generic plan: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("testenv: generic plan: explain: %v", err)
	}
	return strings.Join(lines, "\n")
}
