// Package benv gives each benchmark measurement an isolated slice of the real
// PostgreSQL and RabbitMQ servers that scripts/with-services.sh starts: a
// database of its own for the whole run (so pg_stat_database counts only the
// benchmark's commits), a fresh schema per measurement and a fresh vhost per
// measurement, all removed when the measurement ends.
//
// It reads the same variables as internal/testenv (SAGA_PG_URL,
// SAGA_AMQP_URL, SAGA_RABBIT_API) but takes no testing.TB: the benchmark is a
// command, not a test.
package benv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/internal/rabbitapi"
)

// Environment variable names (the same as internal/testenv's).
const (
	EnvPostgresURL = "SAGA_PG_URL"
	EnvAMQPURL     = "SAGA_AMQP_URL"
	EnvRabbitAPI   = "SAGA_RABBIT_API"
	// EnvNetworkPID is the process id of the network emulator between
	// separate hosts (scripts/hosts.sh sets it); Sample counts its CPU.
	EnvNetworkPID = "SAGA_NETWORK_PID"
)

// Env is one benchmark run's slice of the servers.
type Env struct {
	baseAMQP, api string
	dbURL         string // the run's own database
	dbName        string
	admin         *pgxpool.Pool // on the base database: create/drop the run's database
	db            *pgxpool.Pool // on the run's database: create/drop schemas, read stats
	peer          peer          // counted by Sample next to the run's database (CountPeer)
	traceText     bool          // pools also record statement texts (TraceStatementText)
	networkPID    int           // EnvNetworkPID, or 0
}

// TraceStatementText makes the pools Schema.Pool opens from now on record
// the text of every statement their StatementCounter sees (Top). It costs
// the measured process CPU, so it is off unless asked for.
func (e *Env) TraceStatementText(on bool) { e.traceText = on }

// FromEnv reads the server addresses from the environment and creates the
// run's own database. Close drops it.
func FromEnv(ctx context.Context) (*Env, error) {
	pg, am, api := os.Getenv(EnvPostgresURL), os.Getenv(EnvAMQPURL), os.Getenv(EnvRabbitAPI)
	var missing []string
	for name, v := range map[string]string{EnvPostgresURL: pg, EnvAMQPURL: am, EnvRabbitAPI: api} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s not set: run under scripts/with-services.sh (make bench) or source /tmp/saga-services/env.sh",
			strings.Join(missing, ", "))
	}
	admin, err := pgxpool.New(ctx, pg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", Redact(pg), err)
	}
	if err := admin.Ping(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("PostgreSQL at %s does not answer: %w", Redact(pg), err)
	}
	e := &Env{baseAMQP: am, api: api, admin: admin, dbName: "sagabench_" + randHex(4)}
	if v := os.Getenv(EnvNetworkPID); v != "" {
		if e.networkPID, err = strconv.Atoi(v); err != nil {
			admin.Close()
			return nil, fmt.Errorf("%s=%q: %w", EnvNetworkPID, v, err)
		}
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{e.dbName}.Sanitize()); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create database %s: %w", e.dbName, err)
	}
	u, err := url.Parse(pg)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("parse %s: %w", EnvPostgresURL, err)
	}
	u.Path = "/" + e.dbName
	e.dbURL = u.String()
	e.db, err = pgxpool.New(ctx, e.dbURL)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("connect to database %s: %w", e.dbName, err)
	}
	return e, nil
}

// Close drops the run's database.
func (e *Env) Close() {
	if e.db != nil {
		e.db.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = e.admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", e.dbName)
	if _, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{e.dbName}.Sanitize()); err != nil {
		fmt.Fprintf(os.Stderr, "sagabench: drop database %s: %v\n", e.dbName, err)
	}
	e.admin.Close()
}

// DatabaseURL is the URL of database name on the run's server.
func (e *Env) DatabaseURL(name string) string {
	u, _ := url.Parse(e.dbURL) // parsed in FromEnv
	u.Path = "/" + name
	return u.String()
}

// Database is the name of the run's own database.
func (e *Env) Database() string { return e.dbName }

// DB is a small pool on the run's database (not on any measurement's
// schema), for statistics.
func (e *Env) DB() *pgxpool.Pool { return e.db }

// Schema is one measurement's schema.
type Schema struct {
	Name string
	// URL connects to the run's database with search_path and
	// application_name set to the schema.
	URL string
	env *Env
}

// NewSchema creates a fresh schema in the run's database.
func (e *Env) NewSchema(ctx context.Context, label string) (*Schema, error) {
	name := "b_" + label + "_" + randHex(3)
	if _, err := e.db.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	u, _ := url.Parse(e.dbURL) // parsed in FromEnv
	q := u.Query()
	q.Set("search_path", name)
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return &Schema{Name: name, URL: u.String(), env: e}, nil
}

// Pool opens a pool of at most maxConns connections on the schema. When
// counter is not nil, it counts every statement the server executes for the
// pool; the connections must then be plaintext (sslmode=disable, as
// scripts/services.sh's URL has).
func (s *Schema) Pool(ctx context.Context, maxConns int32, counter ...*StatementCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		return nil, fmt.Errorf("parse pool config of schema %s: %w", s.Name, err)
	}
	cfg.MaxConns = maxConns
	if len(counter) > 0 && counter[0] != nil {
		if err := checkPlaintext(&cfg.ConnConfig.Config); err != nil {
			return nil, fmt.Errorf("pool on schema %s: %w", s.Name, err)
		}
		cfg.ConnConfig.DialFunc = counter[0].wire.dialFunc(cfg.ConnConfig.DialFunc)
		if s.env.traceText {
			cfg.ConnConfig.Tracer = counter[0]
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool on schema %s: %w", s.Name, err)
	}
	return pool, nil
}

// Drop terminates the schema's backends and drops it.
func (s *Schema) Drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = s.env.db.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()", s.Name)
	if _, err := s.env.db.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.Name}.Sanitize()+" CASCADE"); err != nil {
		fmt.Fprintf(os.Stderr, "sagabench: drop schema %s: %v\n", s.Name, err)
	}
}

// PGConn returns the libpq parameters of the run's database, for pgbench:
// host, port, user and database name.
func (e *Env) PGConn() (host, port, user, dbname string) {
	u, _ := url.Parse(e.dbURL)
	user = "postgres"
	if u.User != nil {
		user = u.User.Username()
	}
	return u.Hostname(), u.Port(), user, e.dbName
}

// PGPassword is the password of the base URL, if any.
func (e *Env) PGPassword() string {
	u, _ := url.Parse(e.dbURL)
	if u.User == nil {
		return ""
	}
	pw, _ := u.User.Password()
	return pw
}

// VHost is one measurement's RabbitMQ virtual host.
type VHost struct {
	Name string
	URL  string // AMQP URL on the vhost
	env  *Env
}

// NewVHost creates a fresh vhost and grants the base URL's user every
// permission on it.
func (e *Env) NewVHost(ctx context.Context, label string) (*VHost, error) {
	u, err := url.Parse(e.baseAMQP)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", EnvAMQPURL, err)
	}
	name := "b_" + label + "_" + randHex(3)
	if err := e.rabbitAPI(ctx, http.MethodPut, "/vhosts/"+url.PathEscape(name), nil, nil); err != nil {
		return nil, fmt.Errorf("create vhost %s: %w", name, err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := e.rabbitAPI(ctx, http.MethodPut, "/permissions/"+url.PathEscape(name)+"/"+url.PathEscape(user), perm, nil); err != nil {
		return nil, fmt.Errorf("grant permissions on vhost %s: %w", name, err)
	}
	u.Path = "/" + name
	u.RawPath = "/" + url.PathEscape(name)
	return &VHost{Name: name, URL: u.String(), env: e}, nil
}

// Drop deletes the vhost with its queues and exchanges.
func (v *VHost) Drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.env.rabbitAPI(ctx, http.MethodDelete, "/vhosts/"+url.PathEscape(v.Name), nil, nil); err != nil {
		fmt.Fprintf(os.Stderr, "sagabench: delete vhost %s: %v\n", v.Name, err)
	}
}

// rabbitAPI performs one management API call and decodes a JSON answer into
// out when out is not nil.
func (e *Env) rabbitAPI(ctx context.Context, method, path string, body, out any) error {
	return rabbitapi.Call(ctx, e.api, method, path, body, out)
}

// Redact hides the password of a URL.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails: crypto/rand.Read crashes the program rather than return an error
	return hex.EncodeToString(b)
}
