package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// TestServicesScript drives scripts/services.sh and scripts/with-services.sh
// against servers of the test's own: `restart DIR pg|rabbit|redis|all` brings
// each server back on the same port with its data and leaves the others alone;
// `status` tells running servers from stopped ones; with-services.sh reuses
// the servers SAGA_SERVICES_DIR names only while they run, and never hands
// its command a SAGA_PG_URL or SAGA_AMQP_URL from the caller's environment.
func TestServicesScript(t *testing.T) {
	t.Parallel()
	s := testenv.PrivateServices(t)
	root, err := testenv.ModuleRoot()
	require.NoError(t, err)
	script := func(name string) string { return filepath.Join(root, "scripts", name) }
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Data on both servers: a row in a table, a persistent message in a durable queue.
	const queue = "restart-probe"
	pg, err := pgx.Connect(ctx, s.PostgresURL)
	require.NoError(t, err)
	_, err = pg.Exec(ctx, `CREATE TABLE restart_probe (v text); INSERT INTO restart_probe VALUES ('kept')`)
	require.NoError(t, err)
	require.NoError(t, pg.Close(ctx))
	publishPersistent(ctx, t, s.AMQPURL, queue, "kept")

	restart := func(which string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, script("services.sh"), "restart", s.Dir, which).CombinedOutput()
		require.NoError(t, err, "services.sh restart %s %s:\n%s", s.Dir, which, out)
	}
	// checkData reads the row and counts the message through the URLs env.sh
	// gave at start: the servers answer on the same ports with the same data.
	checkData := func(after string) {
		t.Helper()
		loaded, err := testenv.LoadServices(s.Dir)
		require.NoError(t, err)
		require.Equal(t, *s, *loaded, "env.sh changed by %s", after)
		pg, err := pgx.Connect(ctx, s.PostgresURL)
		require.NoError(t, err, "PostgreSQL at its URL after %s", after)
		defer pg.Close(ctx)
		var v string
		require.NoError(t, pg.QueryRow(ctx, `SELECT v FROM restart_probe`).Scan(&v), "the row after %s", after)
		require.Equal(t, "kept", v)
		require.Equal(t, 1, queueDepth(t, s.AMQPURL, queue), "the persistent message after %s", after)
	}

	// The broker starts with the dead-letter worker's confirm timeout the
	// operators' guide recommends, whichever helper started it.
	confirmTimeout := func(after string) {
		t.Helper()
		out, err := s.RabbitCtl(ctx, "eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).")
		require.NoError(t, err)
		require.Equal(t, "{ok,5000}", strings.TrimSpace(out), "dead_letter_worker_publisher_confirm_timeout after %s", after)
	}
	confirmTimeout("start")

	pg0, rabbit0 := pgPID(t, s.Dir), rabbitPID(t, s.Dir)
	restart("pg")
	pg1, rabbit1 := pgPID(t, s.Dir), rabbitPID(t, s.Dir)
	require.NotEqual(t, pg0, pg1, "restart pg must start a new postmaster")
	require.Equal(t, rabbit0, rabbit1, "restart pg must leave RabbitMQ running")
	checkData("restart pg")

	restart("rabbit")
	pg2, rabbit2 := pgPID(t, s.Dir), rabbitPID(t, s.Dir)
	require.Equal(t, pg1, pg2, "restart rabbit must leave PostgreSQL running")
	require.NotEqual(t, rabbit1, rabbit2, "restart rabbit must start a new node")
	checkData("restart rabbit")
	confirmTimeout("restart rabbit")
	require.NoError(t, s.RestartRabbitMQ(ctx))
	confirmTimeout("testenv's RestartRabbitMQ")
	checkData("testenv's RestartRabbitMQ")

	out, err := exec.CommandContext(ctx, script("services.sh"), "restart", s.Dir).CombinedOutput()
	require.NoError(t, err, "services.sh restart %s:\n%s", s.Dir, out)
	pg3, rabbit3 := pgPID(t, s.Dir), rabbitPID(t, s.Dir)
	require.NotEqual(t, pg2, pg3, "restart (all) must restart PostgreSQL")
	require.NotEqual(t, rabbit2, rabbit3, "restart (all) must restart RabbitMQ")
	checkData("restart (all)")

	// Redis keeps its keys (append-only file) across a restart and comes
	// back on its port; the others keep running.
	require.NotEmpty(t, s.RedisURL)
	redisOpts, err := redis.ParseURL(s.RedisURL)
	require.NoError(t, err)
	rc := redis.NewClient(redisOpts)
	defer rc.Close()
	require.NoError(t, rc.Set(ctx, "restart-probe", "kept", 0).Err())
	restart("redis")
	pg4, rabbit4 := pgPID(t, s.Dir), rabbitPID(t, s.Dir)
	require.Equal(t, pg3, pg4, "restart redis must leave PostgreSQL running")
	require.Equal(t, rabbit3, rabbit4, "restart redis must leave RabbitMQ running")
	v, err := rc.Get(ctx, "restart-probe").Result()
	require.NoError(t, err, "the key after restart redis")
	require.Equal(t, "kept", v)
	checkData("restart redis")

	out, err = exec.CommandContext(ctx, script("services.sh"), "restart", s.Dir, "kafka").CombinedOutput()
	require.Error(t, err, "restart of an unknown service must fail")
	require.Contains(t, string(out), "unknown service 'kafka'")

	out, err = exec.CommandContext(ctx, script("services.sh"), "status", s.Dir).CombinedOutput()
	require.NoError(t, err, "status of running services:\n%s", out)
	require.Contains(t, string(out), "export SAGA_PG_URL='"+s.PostgresURL+"'")

	// with-services.sh reuses the running servers SAGA_SERVICES_DIR names,
	// with their URLs, not the caller's.
	callerEnv := []string{
		testenv.EnvServicesDir + "=" + s.Dir,
		testenv.EnvPostgresURL + "=postgres://me@db.example.com/mine",
		testenv.EnvAMQPURL + "=amqp://me@mq.example.com/mine",
	}
	got := withServices(ctx, t, script("with-services.sh"), callerEnv)
	require.Equal(t, []string{s.Dir, s.PostgresURL, s.AMQPURL}, got)

	// Once they are stopped, it starts servers of its own instead, and still
	// overrides the caller's URLs.
	require.NoError(t, s.Stop(ctx))
	out, err = exec.CommandContext(ctx, script("services.sh"), "status", s.Dir).CombinedOutput()
	require.Error(t, err, "status of stopped services must fail:\n%s", out)
	require.Contains(t, string(out), "PostgreSQL: not running")
	require.Contains(t, string(out), "RabbitMQ: not running")
	require.Contains(t, string(out), "Redis: not running")
	got = withServices(ctx, t, script("with-services.sh"), callerEnv)
	require.NotEqual(t, s.Dir, got[0], "stopped services must not be reused")
	for i, name := range []string{testenv.EnvPostgresURL, testenv.EnvAMQPURL} {
		require.NotContains(t, got[i+1], "example.com", "%s from the caller's environment reached the command", name)
		require.Contains(t, got[i+1], "@127.0.0.1:", "%s is not a private server's", name)
	}
	_, err = os.Stat(got[0])
	require.True(t, os.IsNotExist(err), "with-services.sh must remove its services directory %s after a successful run", got[0])
}

// withServices runs with-services.sh with env added to the test's
// environment and returns what its command saw: SAGA_SERVICES_DIR,
// SAGA_PG_URL and SAGA_AMQP_URL.
func withServices(ctx context.Context, t *testing.T, script string, env []string) []string {
	t.Helper()
	cmd := exec.CommandContext(ctx, script, "sh", "-c", `printf '%s\n%s\n%s\n' "$SAGA_SERVICES_DIR" "$SAGA_PG_URL" "$SAGA_AMQP_URL"`)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "with-services.sh:\n%s", stderr.String())
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	require.Len(t, lines, 3, "with-services.sh printed %q", out)
	return lines
}

func publishPersistent(ctx context.Context, t *testing.T, amqpURL, queue, body string) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	require.NoError(t, err)
	ok, err := dc.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok, "the broker nacked the probe message")
}

func queueDepth(t *testing.T, amqpURL, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err, "queue %s", queue)
	return q.Messages
}

func pgPID(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pg", "data", "postmaster.pid"))
	require.NoError(t, err)
	pid, _, _ := strings.Cut(string(b), "\n")
	require.NotEmpty(t, pid)
	return pid
}

func rabbitPID(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rabbit", "rabbit.pid"))
	require.NoError(t, err)
	pid := strings.TrimSpace(string(b))
	require.NotEmpty(t, pid)
	return pid
}
