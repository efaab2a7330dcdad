package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// databaseEnv is an environment with only SAGA_PG_URL set, to dsn.
func databaseEnv(dsn string) func(string) string {
	return func(k string) string {
		if k == "SAGA_PG_URL" {
			return dsn
		}
		return ""
	}
}

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "0001_orders.sql"), []byte("CREATE TABLE saga_orders (id uuid PRIMARY KEY);"), 0o600))
	env := databaseEnv(dsn)
	ctx := context.Background()

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"migrate", "-status", "-source", "orders=" + dir}, &out, &errOut, env), errOut.String())
	require.Regexp(t, `(?m)^orders +0001_orders\.sql +pending`, out.String())
	runtimeFiles, err := filepath.Glob("../../runtime/schema/migrations/*.sql")
	require.NoError(t, err)
	require.Contains(t, out.String(), fmt.Sprintf("%d pending", len(runtimeFiles)+1), "every runtime migration and the source's one")

	for range 2 { // the second run is a no-op
		out.Reset()
		require.Equal(t, 0, run(ctx, []string{"migrate", "-source", "orders=" + dir}, &out, &errOut, env), errOut.String())
		require.Regexp(t, `(?m)^runtime +0001_runtime_tables\.sql +applied`, out.String())
		require.Regexp(t, `(?m)^orders +0001_orders\.sql +applied`, out.String())
		require.Contains(t, out.String(), "is up to date")
	}

	require.NoError(t, os.WriteFile(filepath.Join(dir, "0001_orders.sql"), []byte("CREATE TABLE saga_orders (id bigint);"), 0o600))
	errOut.Reset()
	require.Equal(t, 1, run(ctx, []string{"migrate", "-source", "orders=" + dir}, &out, &errOut, env))
	require.Contains(t, errOut.String(), "migration orders/0001_orders.sql was applied at")
}

// TestMigrateStatusListsRecordedSources: -status lists the migrations the
// database recorded for sources it was not given (a service's sagas), and
// marks a recorded file its source no longer holds; -participant applies
// runtime/participant's migrations.
func TestMigrateStatusListsRecordedSources(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "0001_orders.sql"), []byte("CREATE TABLE saga_orders (id uuid PRIMARY KEY);"), 0o600))
	env := databaseEnv(dsn)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"migrate", "-participant", "-source", "saga_orders=" + dir}, &out, &errOut, env), errOut.String())
	require.Regexp(t, `(?m)^participant +0001_participant_once\.sql +applied`, out.String())

	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"migrate", "-status"}, &out, &errOut, env), errOut.String())
	require.Regexp(t, `(?m)^runtime +0001_runtime_tables\.sql +applied +20`, out.String())
	require.Regexp(t, `(?m)^participant +0001_participant_once\.sql +applied +20`, out.String())
	require.Regexp(t, `(?m)^saga_orders +0001_orders\.sql +applied +20`, out.String())
	require.NotRegexp(t, `(?m)^\S+ +\S+ +pending`, out.String())
	require.NotContains(t, out.String(), " pending\n", "no count of pending files")

	require.NoError(t, os.Rename(filepath.Join(dir, "0001_orders.sql"), filepath.Join(dir, "0002_orders.sql")))
	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"migrate", "-status", "-source", "saga_orders=" + dir}, &out, &errOut, env), errOut.String())
	require.Regexp(t, `(?m)^saga_orders +0001_orders\.sql +applied, no file +20`, out.String())
	require.Regexp(t, `(?m)^saga_orders +0002_orders\.sql +pending`, out.String())
	require.Contains(t, out.String(), "1 pending")
}

func TestMigrateCommandErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	none := func(string) string { return "" }
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(ctx, nil, &out, &errOut, none))
	require.Equal(t, 2, run(ctx, []string{"frobnicate"}, &out, &errOut, none))
	require.Equal(t, 1, run(ctx, []string{"migrate"}, &out, &errOut, none))
	require.Contains(t, errOut.String(), "no database URL")
	require.Equal(t, 2, run(ctx, []string{"migrate", "-source", "x"}, &out, &errOut, none), "a malformed flag is a usage error")
	require.Contains(t, errOut.String(), "want NAME=DIR")

	errOut.Reset()
	u := url.URL{Scheme: "postgres", User: url.UserPassword("u", "s3cret"), Host: "127.0.0.1:1", Path: "/db"}
	require.Equal(t, 1, run(ctx, []string{"migrate", "-timeout", "2s", "-database-url", u.String()}, &out, &errOut, none))
	require.NotContains(t, errOut.String(), "s3cret")
	require.Contains(t, errOut.String(), "postgres://u:xxxxx@127.0.0.1:1/db")

	// A password can be given as a query parameter too.
	for _, q := range []string{"password=s3cret", "sslmode=disable&Password=s3cret", "sslpassword=s3cret&password=s3cret", "pass%77ord=s3cret"} {
		errOut.Reset()
		u := "postgres://u@127.0.0.1:1/db?" + q
		require.Equal(t, 1, run(ctx, []string{"migrate", "-timeout", "2s", "-database-url", u}, &out, &errOut, none))
		require.NotContains(t, errOut.String(), "s3cret", q)
		require.Contains(t, errOut.String(), "postgres://u@127.0.0.1:1/db?", q)
		require.Contains(t, errOut.String(), "=xxxxx", q)
	}
	require.Equal(t, "postgres://u@h/db?sslmode=require&password=xxxxx&application_name=x",
		redact("postgres://u@h/db?sslmode=require&password=s3cret&application_name=x"), "other parameters stay as they are")
}

// TestPruneCommand: prune deletes the old published outbox rows, old
// inbox claims and old once records it is asked to, and nothing else.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	env := databaseEnv(dsn)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"migrate", "-participant"}, &out, &errOut, env), errOut.String())
	pool, _, err := openDatabase(ctx, dsn, env)
	require.NoError(t, err)
	defer pool.Close()
	// Three outbox rows: published three days ago, published an hour ago,
	// never published. Two inbox claims: forty days old and new.
	_, err = pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
SELECT m, 'x', 'k', 't', 1, '\x00', now() FROM unnest(ARRAY['old', 'recent', 'unpublished']) AS m`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `WITH done AS (DELETE FROM saga_outbox_pending p USING saga_outbox o
  WHERE o.id = p.id AND o.message_id IN ('old', 'recent') RETURNING p.id, o.message_id)
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay)
SELECT id, CASE message_id WHEN 'old' THEN now() - interval '3 days' ELSE now() - interval '1 hour' END, 1, 'test' FROM done`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id, received_at)
VALUES ('c', 'ancient', now() - interval '40 days'), ('c', 'fresh', now())`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key, first_at)
VALUES ('inventory', 'old', now() - interval '40 days'), ('payment', 'old', now() - interval '31 days'), ('inventory', 'new', now())`)
	require.NoError(t, err)

	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"prune", "-outbox", "48h", "-inbox", "720h", "-once", "720h"}, &out, &errOut, env), errOut.String())
	require.Regexp(t, `(?m)^outbox: deleted 1 rows published before `, out.String())
	require.Regexp(t, `(?m)^inbox: deleted 1 claims received before `, out.String())
	require.Regexp(t, `(?m)^once: deleted 2 once records written before `, out.String())
	var onceLeft []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(service || '/' || idempotency_key) FROM saga_participant_once`).Scan(&onceLeft))
	require.Equal(t, []string{"inventory/new"}, onceLeft)
	var outboxLeft, inboxLeft []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(message_id ORDER BY id) FROM saga_outbox`).Scan(&outboxLeft))
	require.Equal(t, []string{"recent", "unpublished"}, outboxLeft)
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(message_id) FROM saga_inbox`).Scan(&inboxLeft))
	require.Equal(t, []string{"fresh"}, inboxLeft)

	for args, msg := range map[string]string{
		"":                      "sagactl prune: pass -outbox AGE, -inbox AGE, -once AGE, or several",
		"-outbox -1h":           "sagactl prune: ages must not be negative",
		"-once -1h":             "sagactl prune: ages must not be negative",
		"-outbox 1h extra":      `sagactl prune: unexpected arguments ["extra"]`,
		"-outbox 7d":            `sagactl prune: invalid value "7d" for flag -outbox: parse error`,
		"-inbox 1h -timeout 0s": "sagactl prune: -timeout must be positive",
	} {
		errOut.Reset()
		require.Equal(t, 2, run(ctx, append([]string{"prune"}, strings.Fields(args)...), &out, &errOut, env), "%q", args)
		require.Contains(t, errOut.String(), msg+"\n", "%q", args)
		require.NotContains(t, errOut.String(), "sagactl prune: sagactl prune:", "%q", args)
	}
}

// TestMigrateLeavesAnotherToolsDatabase: where the runtime's tables exist
// without sagactl's records (goose or golang-migrate applied exported
// files), migrate and -status refuse instead of applying or listing every
// migration as pending.
func TestMigrateLeavesAnotherToolsDatabase(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	env := databaseEnv(dsn)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"migrate"}, &out, &errOut, env), errOut.String())
	pool, _, err := openDatabase(ctx, dsn, env)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, "DROP TABLE saga_schema_migrations, saga_schema_sources")
	require.NoError(t, err)

	for _, args := range [][]string{{"migrate"}, {"migrate", "-status"}} {
		out.Reset()
		errOut.Reset()
		require.Equal(t, 1, run(ctx, args, &out, &errOut, env), args)
		require.Contains(t, errOut.String(), "another tool (goose, golang-migrate) migrates this database", args)
		require.Empty(t, out.String(), args)
	}
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('saga_schema_migrations') IS NOT NULL").Scan(&exists))
	require.False(t, exists, "nothing applied")
}
