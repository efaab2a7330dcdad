package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/protosaga/saga/internal/rabbitapi"
)

// Services are a PostgreSQL and a RabbitMQ server started by
// scripts/services.sh in Dir, as plain processes this machine can stop and
// start again. Restarting a server breaks every client of it, so tests that
// restart servers must not share them with tests running in parallel: give
// them servers of their own with PrivateServices (the choice this repository
// makes for its chaos soak, so `go test ./...` may run every package at once),
// or run them alone against SharedServices.
type Services struct {
	// Dir is the services directory (data directories, sockets, logs).
	Dir string
	// PostgresURL is the base PostgreSQL URL (database "saga").
	PostgresURL string
	// AMQPURL is the base AMQP URL (vhost "/").
	AMQPURL string
	// RabbitAPI is the management API base URL, with credentials.
	RabbitAPI string
	// Nodes is the number of RabbitMQ nodes of a cluster
	// (scripts/services.sh cluster-start), 0 for a single node. AMQPURL
	// then lists every node's URL, comma-separated.
	Nodes int
	// RabbitAPIs are every node's management API, for a cluster; API
	// asks them in turn, so that it answers while a node is down.
	RabbitAPIs []string
	// Replica is true for a PostgreSQL with a streaming replica
	// (scripts/services.sh replica-start): PostgresURL then names both
	// servers with target_session_attrs=read-write.
	Replica bool
	// RedisURL is the Redis server's URL (database 0).
	RedisURL string
}

// EnvServicesDir names the services directory scripts/services.sh writes
// into env.sh.
const EnvServicesDir = "SAGA_SERVICES_DIR"

// LoadServices reads the env.sh that scripts/services.sh wrote in dir.
func LoadServices(dir string) (*Services, error) {
	f, err := os.Open(filepath.Join(dir, "env.sh"))
	if err != nil {
		return nil, fmt.Errorf("services in %s: %w", dir, err)
	}
	defer f.Close()
	s := &Services{Dir: dir}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export ")
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		value = strings.Trim(value, `'"`)
		switch name {
		case EnvServicesDir:
			s.Dir = value
		case EnvPostgresURL:
			s.PostgresURL = value
		case EnvAMQPURL:
			s.AMQPURL = value
		case EnvRabbitAPI:
			s.RabbitAPI = value
		case "SAGA_RABBIT_APIS":
			s.RabbitAPIs = strings.Split(value, ",")
		case EnvRedisURL:
			s.RedisURL = value
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("services in %s: read env.sh: %w", dir, err)
	}
	if s.PostgresURL == "" || s.AMQPURL == "" || s.RabbitAPI == "" {
		return nil, fmt.Errorf("services in %s: env.sh lacks %s, %s or %s", dir, EnvPostgresURL, EnvAMQPURL, EnvRabbitAPI)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "pg2", "port")); err == nil {
		s.Replica = true
	}
	if b, err := os.ReadFile(filepath.Join(s.Dir, "cluster-size")); err == nil {
		if s.Nodes, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return nil, fmt.Errorf("services in %s: cluster-size: %w", dir, err)
		}
	}
	return s, nil
}

// StartCluster starts a PostgreSQL and a cluster of nodes RabbitMQ nodes in
// dir with scripts/services.sh cluster-start (about 30 s a node) and
// returns them.
func StartCluster(ctx context.Context, dir string, nodes int) (*Services, error) {
	script, err := servicesScript()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, script, "cluster-start", dir, strconv.Itoa(nodes)).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("start a cluster of %d nodes in %s: %w\n%s", nodes, dir, err, out)
	}
	return LoadServices(dir)
}

// StartReplicated starts a RabbitMQ and a PostgreSQL with a streaming
// replica in dir with scripts/services.sh replica-start; mode is "sync" or
// "async".
func StartReplicated(ctx context.Context, dir, mode string) (*Services, error) {
	script, err := servicesScript()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, script, "replica-start", dir, mode).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL with a %s replica in %s: %w\n%s", mode, dir, err, out)
	}
	return LoadServices(dir)
}

// Failover crashes the primary PostgreSQL of a replicated pair (immediate
// stop) and promotes the replica (scripts/services.sh replica-failover).
func (s *Services) Failover(ctx context.Context) error {
	script, err := servicesScript()
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, script, "replica-failover", s.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("fail over PostgreSQL in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// KillNode SIGKILLs RabbitMQ node i (1-based) of a cluster, as a machine
// that dies; StartNode starts it again on its data, and it rejoins.
func (s *Services) KillNode(ctx context.Context, i int) error { return s.clusterNode(ctx, i, "kill") }

// StartNode starts node i (1-based) of a cluster after KillNode.
func (s *Services) StartNode(ctx context.Context, i int) error { return s.clusterNode(ctx, i, "start") }

func (s *Services) clusterNode(ctx context.Context, i int, what string) error {
	script, err := servicesScript()
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, script, "cluster-node", s.Dir, strconv.Itoa(i), what).CombinedOutput(); err != nil {
		return fmt.Errorf("cluster node %d in %s: %s: %w\n%s", i, s.Dir, what, err, out)
	}
	return nil
}

// NodeOf returns the 1-based index of the cluster node named name (as the
// management API names it, "saga<port>@localhost"), or 0.
func (s *Services) NodeOf(name string) int {
	for i := 1; i <= s.Nodes; i++ {
		b, err := os.ReadFile(filepath.Join(s.Dir, fmt.Sprintf("node%d", i), "rabbit", "port"))
		if err == nil && "saga"+strings.TrimSpace(string(b))+"@localhost" == name {
			return i
		}
	}
	return 0
}

// StartServices starts a PostgreSQL and a RabbitMQ in dir with
// scripts/services.sh (about 15 s) and returns them.
func StartServices(ctx context.Context, dir string) (*Services, error) {
	script, err := servicesScript()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, script, "start", dir).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("start services in %s: %w\n%s", dir, err, out)
	}
	return LoadServices(dir)
}

// Stop stops both servers (scripts/services.sh stop) and leaves Dir.
func (s *Services) Stop(ctx context.Context) error {
	script, err := servicesScript()
	if err != nil {
		return err
	}
	stop := "stop"
	switch {
	case s.Nodes > 0:
		stop = "cluster-stop"
	case s.Replica:
		stop = "replica-stop"
	}
	if out, err := exec.CommandContext(ctx, script, stop, s.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("stop services in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// PrivateServices starts servers of the test's own in a temporary directory
// and stops them when the test ends. Their logs are kept (and named in the
// test log) when the test fails. Use them for tests that restart servers.
func PrivateServices(t testing.TB) *Services {
	t.Helper()
	require(t, EnvPostgresURL) // same skip/fail policy as every integration test
	dir, err := os.MkdirTemp("", "saga-private-services-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	_ = os.Chmod(dir, 0o755) // the postgres user must reach its data directory
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := StartServices(ctx, dir)
	if err != nil {
		t.Fatalf("testenv: private services: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Logf("testenv: %v", err)
		}
		if t.Failed() {
			t.Logf("testenv: private services' logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return s
}

// SharedServices returns the servers named by SAGA_SERVICES_DIR (the ones
// `make test` or `make services-start` started). Restarting them breaks
// every test running in parallel against them: only a test that runs alone
// may.
func SharedServices(t testing.TB) *Services {
	t.Helper()
	dir := require(t, EnvServicesDir)
	s, err := LoadServices(dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return s
}

// RestartPostgres stops PostgreSQL and starts it again. With immediate it
// stops like a crash (no checkpoint; the server recovers from its WAL at
// start), otherwise it shuts down fast (clients are disconnected, work is
// checkpointed). It returns once the server accepts connections again.
func (s *Services) RestartPostgres(ctx context.Context, immediate bool) error {
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	data := filepath.Join(s.Dir, "pg", "data")
	args := []string{"-D", data, "-m", mode, "-w", "-t", "120", "-l", filepath.Join(s.Dir, "pg", "postgres.log"), "restart"}
	cmd := s.asPostgres(ctx, filepath.Join(s.pgBin(), "pg_ctl"), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restart PostgreSQL in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// StopPostgres stops PostgreSQL (fast shutdown); StartPostgres starts it.
// Together they make an outage of a chosen length.
func (s *Services) StopPostgres(ctx context.Context) error {
	cmd := s.asPostgres(ctx, filepath.Join(s.pgBin(), "pg_ctl"), "-D", filepath.Join(s.Dir, "pg", "data"), "-m", "fast", "-w", "stop")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("stop PostgreSQL in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// StartPostgres starts a PostgreSQL stopped by StopPostgres.
func (s *Services) StartPostgres(ctx context.Context) error {
	cmd := s.asPostgres(ctx, filepath.Join(s.pgBin(), "pg_ctl"), "-D", filepath.Join(s.Dir, "pg", "data"),
		"-l", filepath.Join(s.Dir, "pg", "postgres.log"), "-w", "-t", "120", "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start PostgreSQL in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// RestartRabbitMQ stops the RabbitMQ node (rabbitmqctl stop, which waits for
// the Erlang VM to exit: every connection drops, the port closes) and starts
// it again as scripts/services.sh does. It returns once the node has booted
// and its management API answers. Durable queues and persistent messages
// survive; everything else is gone.
func (s *Services) RestartRabbitMQ(ctx context.Context) error {
	if err := s.StopRabbitMQ(ctx); err != nil {
		return err
	}
	return s.StartRabbitMQ(ctx)
}

// RabbitCtl runs rabbitmqctl with args against the node (for example
// set_vm_memory_high_watermark, to raise a resource alarm) and returns its
// output.
func (s *Services) RabbitCtl(ctx context.Context, args ...string) (string, error) {
	env, err := s.rabbitEnv()
	if err != nil {
		return "", err
	}
	cmd := s.command(ctx, filepath.Join(rabbitBin(), "rabbitmqctl"), args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s in %s: %w\n%s", strings.Join(args, " "), s.Dir, err, out)
	}
	return string(out), nil
}

// StopRabbitMQ stops the RabbitMQ node and waits for it to exit.
func (s *Services) StopRabbitMQ(ctx context.Context) error {
	env, err := s.rabbitEnv()
	if err != nil {
		return err
	}
	pidFile := filepath.Join(s.Dir, "rabbit", "rabbit.pid")
	cmd := s.command(ctx, filepath.Join(rabbitBin(), "rabbitmqctl"), "-q", "stop", pidFile)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("stop RabbitMQ in %s: %w\n%s", s.Dir, err, out)
	}
	return nil
}

// StartRabbitMQ starts the node stopped by StopRabbitMQ, detached in a
// session of its own (it outlives the calling process, like the one
// services.sh started), and waits until it and its management API answer.
func (s *Services) StartRabbitMQ(ctx context.Context) error {
	env, err := s.rabbitEnv()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.Dir, "rabbit", "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start RabbitMQ in %s: %w", s.Dir, err)
	}
	defer logf.Close()
	server := s.command(context.Background(), filepath.Join(rabbitBin(), "rabbitmq-server"))
	server.Env = env
	server.Stdout, server.Stderr = logf, logf
	server.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := server.Start(); err != nil {
		return fmt.Errorf("start RabbitMQ in %s: %w", s.Dir, err)
	}
	go func() { _ = server.Wait() }() // reap it if it exits while we run
	// await_startup fails at once while the node is not reachable yet.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		await := s.command(ctx, filepath.Join(rabbitBin(), "rabbitmqctl"), "-q", "await_startup", "--timeout", "60")
		await.Env = env
		out, err := await.CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("RabbitMQ in %s did not start: %w\n%s", s.Dir, err, out)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	for {
		if err := s.API(ctx, http.MethodGet, "/overview", nil, nil); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("RabbitMQ management API in %s did not answer: %w", s.Dir, err)
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// rabbitEnv is the environment scripts/services.sh's rmq_env exports.
func (s *Services) rabbitEnv() ([]string, error) {
	dir := filepath.Join(s.Dir, "rabbit")
	b, err := os.ReadFile(filepath.Join(dir, "port"))
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ in %s: %w", s.Dir, err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ in %s: port file: %w", s.Dir, err)
	}
	env := os.Environ()
	return append(env,
		"HOME="+filepath.Join(dir, "home"),
		fmt.Sprintf("RABBITMQ_NODENAME=saga%d@localhost", port),
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", port+20000),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbit.pid"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "empty-env"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	), nil
}

// CreateVHost creates a vhost, grants the AMQP URL's user every permission on
// it and returns an AMQP URL for it (a list of the nodes' URLs for a
// cluster).
func (s *Services) CreateVHost(ctx context.Context, name string) (string, error) {
	bases := strings.Split(s.AMQPURL, ",")
	u, err := url.Parse(bases[0])
	if err != nil {
		return "", fmt.Errorf("parse AMQP URL: %w", err)
	}
	if err := s.API(ctx, http.MethodPut, "/vhosts/"+url.PathEscape(name), nil, nil); err != nil {
		return "", fmt.Errorf("create vhost %s: %w", name, err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := s.API(ctx, http.MethodPut, "/permissions/"+url.PathEscape(name)+"/"+url.PathEscape(user), perm, nil); err != nil {
		return "", fmt.Errorf("grant permissions on vhost %s: %w", name, err)
	}
	urls := make([]string, len(bases))
	for i, b := range bases {
		u, err := url.Parse(b)
		if err != nil {
			return "", fmt.Errorf("parse AMQP URL: %w", err)
		}
		u.Path = "/" + name
		u.RawPath = "/" + url.PathEscape(name)
		urls[i] = u.String()
	}
	return strings.Join(urls, ","), nil
}

// QueueStat is one queue as the management API reports it (with up to
// collect_statistics_interval of lag).
type QueueStat struct {
	Name string `json:"name"`
	// Leader and Members are a quorum queue's leader node and member
	// nodes (node names as in NodeOf).
	Leader         string   `json:"leader"`
	Members        []string `json:"members"`
	Messages       int      `json:"messages"`
	Ready          int      `json:"messages_ready"`
	Unacknowledged int      `json:"messages_unacknowledged"`
	Consumers      int      `json:"consumers"`
}

// Queues lists the queues of a vhost.
func (s *Services) Queues(ctx context.Context, vhost string) ([]QueueStat, error) {
	var qs []QueueStat
	if err := s.API(ctx, http.MethodGet, "/queues/"+url.PathEscape(vhost), nil, &qs); err != nil {
		return nil, fmt.Errorf("list queues of vhost %s: %w", vhost, err)
	}
	return qs, nil
}

// API performs a management API call on these services (path already
// escaped, e.g. "/vhosts/"+url.PathEscape(name)), decoding a JSON answer
// into out when out is not nil.
func (s *Services) API(ctx context.Context, method, path string, body, out any) error {
	err := rabbitapi.Call(ctx, s.RabbitAPI, method, path, body, out)
	for _, api := range s.RabbitAPIs {
		if err == nil || ctx.Err() != nil {
			break
		}
		if api != s.RabbitAPI {
			err = rabbitapi.Call(ctx, api, method, path, body, out)
		}
	}
	return err
}

// root returns the Debian 13 root the servers of s run in
// (scripts/services.sh with SAGA_SERVICES_VERSIONS=new, recorded in
// Dir/versions), or "" when they run on the host.
func (s *Services) root() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "versions"))
	if err != nil || strings.TrimSpace(string(b)) != "new" {
		return ""
	}
	if r := os.Getenv("SAGA_TRIXIE_ROOT"); r != "" {
		return r
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "protosaga", "trixie-root")
}

// command runs a server's tool where the server runs: in its root, if any
// (Dir is mounted at the same path inside).
func (s *Services) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if r := s.root(); r != "" {
		return exec.CommandContext(ctx, "chroot", append([]string{r, name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

func (s *Services) pgBin() string {
	if s.root() != "" {
		return "/usr/lib/postgresql/17/bin"
	}
	if d := os.Getenv("SAGA_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

func rabbitBin() string {
	if d := os.Getenv("SAGA_RABBITMQ_BIN"); d != "" {
		return d
	}
	return "/usr/lib/rabbitmq/bin"
}

// asPostgres runs a PostgreSQL tool as the postgres user when we are root
// (the server refuses to run as root), as services.sh does: in the servers'
// root as its postgres user, if they run in one.
func (s *Services) asPostgres(ctx context.Context, name string, args ...string) *exec.Cmd {
	if r := s.root(); r != "" {
		return exec.CommandContext(ctx, "chroot", append([]string{"--userspec=" + rootPostgres(r), r, name}, args...)...)
	}
	if os.Geteuid() == 0 {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// rootPostgres returns "uid:gid" of the postgres user of root (the owner of
// the data directory services.sh made for the servers in it).
func rootPostgres(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err == nil {
		for line := range strings.Lines(string(b)) {
			f := strings.Split(line, ":")
			if len(f) > 3 && f[0] == "postgres" {
				return f[2] + ":" + f[3]
			}
		}
	}
	return "postgres:postgres"
}

// servicesScript finds scripts/services.sh in the module around the working
// directory.
func servicesScript() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "scripts", "services.sh"), nil
}

// ModuleRoot returns the directory of this repository's go.mod, searching
// upwards from the working directory (a package's directory under go test).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/protosaga/saga\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the protosaga/saga module root is not above the working directory")
		}
		dir = parent
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
