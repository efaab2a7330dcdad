package temporalsaga

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ServerConfig says where the server's binaries are and which PostgreSQL
// server it persists to.
type ServerConfig struct {
	// Bin is the server (go.temporal.io/server/cmd/server), SQLTool its
	// schema tool (go.temporal.io/server/cmd/tools/sql).
	Bin, SQLTool string
	// PostgreSQL: the server creates two databases of its own there.
	PGHost, PGPort, PGUser, PGPassword string
	// Shards is persistence.numHistoryShards; 0 = 4 (the server's
	// development-postgres12.yaml).
	Shards int
	// Dir holds the configuration and the server's log.
	Dir    string
	Logger *slog.Logger
}

// Server is a Temporal server (frontend, history, matching and worker
// services in one process) on loopback, persisting to two fresh databases.
type Server struct {
	cfg       ServerConfig
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the process has exited
	exitErr   error         // how it exited, once exited is closed
	HostPort  string        // the frontend's gRPC address
	Namespace string        // registered by StartServer
	// DB and VisibilityDB are the server's databases.
	DB, VisibilityDB string
}

// StartServer creates the server's two databases and applies their schema
// with the server's schema tool, starts the server, waits until its frontend
// answers, and registers a namespace. Stop stops it and drops the databases.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Shards == 0 {
		cfg.Shards = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	suffix := randHex(3)
	s := &Server{cfg: cfg, DB: "temporal_" + suffix, VisibilityDB: "temporal_visibility_" + suffix, Namespace: "bench"}
	for _, db := range []struct{ name, schema string }{{s.DB, "postgresql/v12/temporal"}, {s.VisibilityDB, "postgresql/v12/visibility"}} {
		for _, args := range [][]string{{"create-database"}, {"setup-schema", "-v", "0.0"}, {"update-schema", "--schema-name", db.schema}} {
			if err := s.sqlTool(ctx, db.name, args...); err != nil {
				s.dropDatabases()
				return nil, err
			}
		}
	}
	ports, err := freePorts(9)
	if err != nil {
		s.dropDatabases()
		return nil, err
	}
	s.HostPort = fmt.Sprintf("127.0.0.1:%d", ports[0])
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: %w", err)
	}
	confPath := filepath.Join(cfg.Dir, "temporal.yaml")
	dynPath := filepath.Join(cfg.Dir, "dynamic.yaml")
	var conf strings.Builder
	if err := configTemplate.Execute(&conf, map[string]any{
		"Cfg": cfg, "DB": s.DB, "VisDB": s.VisibilityDB, "P": ports, "Dynamic": dynPath,
	}); err != nil {
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: render config: %w", err)
	}
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: %w", err)
	}
	if err := os.WriteFile(dynPath, []byte("{}\n"), 0o644); err != nil {
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: %w", err)
	}
	logf, err := os.Create(filepath.Join(cfg.Dir, "server.log"))
	if err != nil {
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: %w", err)
	}
	s.cmd = exec.Command(cfg.Bin, "--config-file", confPath, "--allow-no-auth", "start")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		s.dropDatabases()
		return nil, fmt.Errorf("temporal server: start %s: %w", cfg.Bin, err)
	}
	s.exited = make(chan struct{})
	go func() { s.exitErr = s.cmd.Wait(); logf.Close(); close(s.exited) }()
	if err := s.ready(ctx); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w (log: %s)", err, logf.Name())
	}
	return s, nil
}

// PID is the server process's id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// ready waits until the frontend answers, then registers the namespace and
// waits for the services' namespace caches to load it.
func (s *Server) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	logger := tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))
	var c client.Client
	for {
		var err error
		c, err = client.DialContext(ctx, client.Options{HostPort: s.HostPort, Namespace: "temporal-system", Logger: logger})
		if err == nil {
			if _, err = c.CheckHealth(ctx, &client.CheckHealthRequest{}); err == nil {
				break
			}
			c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("temporal server: frontend %s did not answer: %w", s.HostPort, err)
		case <-s.exited:
			return fmt.Errorf("temporal server: exited while starting: %v", s.exitErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
	defer c.Close()
	nc, err := client.NewNamespaceClient(client.Options{HostPort: s.HostPort, Logger: logger})
	if err != nil {
		return fmt.Errorf("temporal server: namespace client: %w", err)
	}
	defer nc.Close()
	for {
		err = nc.Register(ctx, &workflowservice.RegisterNamespaceRequest{
			Namespace: s.Namespace, WorkflowExecutionRetentionPeriod: durationpb.New(24 * time.Hour),
		})
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("temporal server: register namespace %s: %w", s.Namespace, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
	for {
		if _, err = nc.Describe(ctx, s.Namespace); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("temporal server: describe namespace %s: %w", s.Namespace, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
	// The history and matching services load new namespaces on their
	// registry's refresh (system.namespaceCacheRefreshInterval, 2 s).
	time.Sleep(3 * time.Second)
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 30 s) and drops its
// databases.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	s.dropDatabases()
}

func (s *Server) dropDatabases() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, db := range []string{s.DB, s.VisibilityDB} {
		if err := s.sqlTool(ctx, db, "drop-database", "--force"); err != nil {
			s.cfg.Logger.Warn("temporal server: drop database", "database", db, "err", err)
		}
	}
}

// sqlTool runs the schema tool on database db.
func (s *Server) sqlTool(ctx context.Context, db string, args ...string) error {
	base := []string{"--plugin", "postgres12", "--endpoint", s.cfg.PGHost, "--port", s.cfg.PGPort,
		"--user", s.cfg.PGUser, "--database", db}
	if s.cfg.PGPassword != "" {
		base = append(base, "--password", s.cfg.PGPassword)
	}
	cmd := exec.CommandContext(ctx, s.cfg.SQLTool, append(base, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("temporal schema tool %s on %s: %w\n%s", strings.Join(args, " "), db, err, out)
	}
	return nil
}

// freePorts returns n distinct loopback ports free at the time of the call,
// between 20000 and 32767: the server stores membership ports in a smallint
// column, and ports below the kernel's ephemeral range (from 32768) are not
// taken by outgoing connections between this check and the server's bind.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for try := 0; len(ports) < n; try++ {
		if try == 1000 {
			return nil, errors.New("temporal server: no free ports between 20000 and 32767")
		}
		p := 20000 + mrand.IntN(12768)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errNoServer is returned when the binaries are not configured.
var errNoServer = errors.New("temporal server: binaries not configured")

// Check says whether cfg names binaries that exist.
func (cfg ServerConfig) Check() error {
	if cfg.Bin == "" || cfg.SQLTool == "" {
		return errNoServer
	}
	for _, p := range []string{cfg.Bin, cfg.SQLTool} {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return fmt.Errorf("temporal server: %s is not a binary (build it with bench/temporal/build.sh)", p)
		}
	}
	return nil
}

// configTemplate is the server's configuration: the services of
// config/development-postgres12.yaml on loopback ports, without archival,
// metrics or pprof listeners.
var configTemplate = template.Must(template.New("temporal.yaml").Parse(`log:
  stdout: true
  level: warn
persistence:
  defaultStore: postgres-default
  visibilityStore: postgres-visibility
  numHistoryShards: {{.Cfg.Shards}}
  datastores:
    postgres-default:
      sql:
        pluginName: postgres12
        databaseName: {{.DB}}
        connectAddr: "{{.Cfg.PGHost}}:{{.Cfg.PGPort}}"
        connectProtocol: tcp
        user: "{{.Cfg.PGUser}}"
        password: "{{.Cfg.PGPassword}}"
        maxConns: 20
        maxIdleConns: 20
        maxConnLifetime: 1h
    postgres-visibility:
      sql:
        pluginName: postgres12
        databaseName: {{.VisDB}}
        connectAddr: "{{.Cfg.PGHost}}:{{.Cfg.PGPort}}"
        connectProtocol: tcp
        user: "{{.Cfg.PGUser}}"
        password: "{{.Cfg.PGPassword}}"
        maxConns: 10
        maxIdleConns: 10
        maxConnLifetime: 1h
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: 127.0.0.1
services:
  frontend:
    rpc:
      grpcPort: {{index .P 0}}
      membershipPort: {{index .P 1}}
      httpPort: {{index .P 2}}
      bindOnLocalHost: true
  history:
    rpc:
      grpcPort: {{index .P 3}}
      membershipPort: {{index .P 4}}
      bindOnLocalHost: true
  matching:
    rpc:
      grpcPort: {{index .P 5}}
      membershipPort: {{index .P 6}}
      bindOnLocalHost: true
  worker:
    rpc:
      grpcPort: {{index .P 7}}
      membershipPort: {{index .P 8}}
      bindOnLocalHost: true
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: "127.0.0.1:{{index .P 0}}"
dcRedirectionPolicy:
  policy: noop
dynamicConfigClient:
  filepath: "{{.Dynamic}}"
  pollInterval: 10s
`))
