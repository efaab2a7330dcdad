package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/schema"
)

// sourceFlags collects repeated -source NAME=DIR flags.
type sourceFlags []schema.Source

// register binds -source and -participant; sources returns the
// participant package's source first (if asked for), then the -source ones.
func (s *sourceFlags) register(fs *flag.FlagSet, verb string) (sources func() []schema.Source) {
	fs.Var(s, "source", "NAME=DIR: a directory of .sql migrations recorded under NAME, such as a saga's generated migrations directory (repeatable, "+verb+" in order)")
	withParticipant := fs.Bool("participant", false, "include runtime/participant's migrations (the saga_participant_once table of participant.Once and participant.Idempotent)")
	return func() []schema.Source {
		if *withParticipant {
			return append([]schema.Source{participant.Migrations}, *s...)
		}
		return *s
	}
}

func (s *sourceFlags) String() string { return "" }

func (s *sourceFlags) Set(v string) error {
	name, dir, ok := strings.Cut(v, "=")
	if !ok || name == "" || dir == "" {
		return fmt.Errorf("want NAME=DIR, got %q", v)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("source %s: %s is not a directory", name, dir)
	}
	*s = append(*s, schema.Source{Name: name, FS: os.DirFS(dir)})
	return nil
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var db dbFlags
	db.register(fs, 5*time.Minute)
	status := fs.Bool("status", false, "list migrations and whether they are applied, those the database recorded for sources not given included; change nothing")
	var flags sourceFlags
	sources := flags.register(fs, "applied")
	if err := db.parse(fs, args); err != nil {
		return err
	}
	return db.run(ctx, getenv, func(ctx context.Context, pool *pgxpool.Pool, u string) error {
		return migrateIn(ctx, pool, u, *status, sources(), stdout)
	})
}

// migrateIn applies sources (unless status) and prints every migration's
// state: those of the runtime and of sources, and those the database
// recorded for other sources.
func migrateIn(ctx context.Context, pool *pgxpool.Pool, u string, status bool, sources []schema.Source, stdout io.Writer) error {
	if !status {
		if err := schema.Migrate(ctx, pool, sources...); err != nil {
			return fmt.Errorf("%s: %w", redact(u), err)
		}
	}
	ms, err := schema.Status(ctx, pool, sources...)
	if err != nil {
		return fmt.Errorf("%s: %w", redact(u), err)
	}
	given := map[string]bool{schema.RuntimeSource: true}
	for _, s := range sources {
		given[s.Name] = true
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tMIGRATION\tSTATE\tAPPLIED AT")
	pending := 0
	for _, m := range ms {
		state, at := "pending", ""
		switch {
		case m.Changed:
			state, at = "CHANGED", m.AppliedAt.UTC().Format(time.RFC3339)
		case m.Applied && m.NoFile && given[m.Source]:
			// A runtime migration of a newer release, or a file since
			// removed from its source (an earlier state set's).
			state, at = "applied, no file", m.AppliedAt.UTC().Format(time.RFC3339)
		case m.Applied:
			state, at = "applied", m.AppliedAt.UTC().Format(time.RFC3339)
		default:
			pending++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Source, m.Name, state, at)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !status {
		fmt.Fprintf(stdout, "database %s is up to date\n", redact(u))
	} else if pending > 0 {
		fmt.Fprintf(stdout, "%d pending\n", pending)
	}
	return nil
}

// dbFlags are the flags of the commands that work straight in the
// database (migrate, prune) rather than through the admin API.
type dbFlags struct {
	url     string
	timeout time.Duration
}

func (d *dbFlags) register(fs *flag.FlagSet, timeout time.Duration) {
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL (default $SAGA_PG_URL, then $DATABASE_URL)")
	fs.DurationVar(&d.timeout, "timeout", timeout, "give up after this long")
}

// parse parses args as parse does; these commands take no positional
// arguments.
func (d *dbFlags) parse(fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("unexpected arguments %q", pos)
	case d.timeout <= 0:
		return usagef("-timeout must be positive")
	}
	return nil
}

// run connects to the database and calls do, all within the timeout.
func (d *dbFlags) run(ctx context.Context, getenv func(string) string, do func(ctx context.Context, pool *pgxpool.Pool, u string) error) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	pool, u, err := openDatabase(ctx, d.url, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	return do(ctx, pool, u)
}

// openDatabase connects to flagURL, else $SAGA_PG_URL, else
// $DATABASE_URL, and returns the pool with the URL it used.
func openDatabase(ctx context.Context, flagURL string, getenv func(string) string) (*pgxpool.Pool, string, error) {
	u := flagURL
	for _, env := range []string{"SAGA_PG_URL", "DATABASE_URL"} {
		if u == "" {
			u = getenv(env)
		}
	}
	if u == "" {
		return nil, "", errors.New("no database URL: pass -database-url or set SAGA_PG_URL")
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		// pgx's parse errors may quote the URL; do not repeat it.
		return nil, "", fmt.Errorf("parse database URL %s: invalid", redact(u))
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("connect to %s: %w", redact(u), err)
	}
	return pool, u, nil
}

// redact hides the passwords of a URL-form connection string, the one in
// its user info and those given as query parameters (password,
// sslpassword); a key=value DSN is not echoed at all.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "<connection string>"
	}
	if u.RawQuery != "" {
		params := strings.Split(u.RawQuery, "&")
		for i, p := range params {
			key, _, _ := strings.Cut(p, "=")
			if k, err := url.QueryUnescape(key); err != nil || secretParams[strings.ToLower(k)] {
				params[i] = key + "=xxxxx"
			}
		}
		u.RawQuery = strings.Join(params, "&")
	}
	return u.Redacted()
}

// secretParams are the connection parameters that hold a secret.
var secretParams = map[string]bool{"password": true, "sslpassword": true}
