package consumer_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
)

// TestDatabaseErrorsEndBounded: the errors a real PostgreSQL gives a
// handler are each routed to an end. Lock conflicts, statement timeouts,
// full disks, read-only transactions and internal errors are retried
// through the tiers and parked when the budget is spent; constraint and
// data errors are parked at once; a statement that ends its own connection
// charges no attempt (the database went away) and is parked by the
// redelivery guard once it has done so MaxRedeliveries + 3 times.
func TestDatabaseErrorsEndBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	raise := func(code string) string {
		return `DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '` + code + `'; END $$`
	}
	cases := []struct {
		code, sql, class string
		attempts         []int
	}{
		{"40001", raise("40001"), "exhausted", []int{1, 2, 3}},
		{"40P01", raise("40P01"), "exhausted", []int{1, 2, 3}},
		{"57014", `SET LOCAL statement_timeout = 10; SELECT pg_sleep(5)`, "exhausted", []int{1, 2, 3}},
		{"53100", raise("53100"), "exhausted", []int{1, 2, 3}},
		{"25006", raise("25006"), "exhausted", []int{1, 2, 3}},
		{"XX000", raise("XX000"), "exhausted", []int{1, 2, 3}},
		{"23505", raise("23505"), "permanent", []int{1}},
		{"22012", `SELECT 1/0`, "permanent", []int{1}},
		{"57P01", `SELECT pg_terminate_backend(pg_backend_pid())`, "permanent", []int{1}},
	}
	statement := map[string]string{}
	for _, c := range cases {
		statement["pg-"+c.code] = c.sql
	}
	handler := func(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) error {
		id := d.Envelope.MessageID
		b.mu.Lock()
		b.calls[id] = append(b.calls[id], call{attempt: d.Attempt})
		b.mu.Unlock()
		_, err := tx.Exec(ctx, statement[id])
		return err
	}
	const maxRedeliveries = 2
	r := b.start(func(c *consumer.Config) { c.Handler = handler; c.MaxRedeliveries = maxRedeliveries }, nil)
	for _, c := range cases {
		b.send("pg-"+c.code, "", nil)
	}
	for _, c := range cases {
		b.waitSettled("pg-"+c.code, "park")
	}
	b.stop(r)

	rows := b.parked()
	for _, c := range cases {
		id := "pg-" + c.code
		require.Equal(t, c.attempts, slices.Compact(b.attemptsOf(id)), c.code)
		require.Equal(t, c.class, rows[id].Class, c.code)
		require.Equal(t, c.attempts[len(c.attempts)-1], rows[id].Attempts, c.code)
	}
	require.Len(t, b.callsOf("pg-57P01"), maxRedeliveries+3)
	require.Contains(t, rows["pg-57P01"].Reason, "database error")
	require.Zero(t, b.ready(b.queue))
}

// TestReadOnlyDatabaseChargesNothing: a database that refuses writes (a
// failover that left the pool on a read-only server) fails every inbox
// claim before a handler runs. No attempt is charged and nothing is parked,
// however often the deliveries come back — the redelivery guard cannot
// record a suspect either —; once the database takes writes, each message
// goes on where it was.
func TestReadOnlyDatabaseChargesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	readOnly, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(readOnly.Close)

	b.send("once", doTransientOnce, nil)
	b.send("ok", doOK, nil)
	b.send("perm", doPermanent, nil)
	var logs testenv.LogBuffer
	r := b.start(func(c *consumer.Config) {
		c.Pool, c.MaxRedeliveries = readOnly, 1
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	}, nil)
	// Sessions end on the refused claim, again and again, past the guard's
	// limit.
	require.Eventually(t, func() bool {
		n := 0
		for _, rec := range logs.Records(t, "consumer session ended; starting a new one") {
			if e, _ := rec["error"].(string); strings.Contains(e, "25006") {
				n++
			}
		}
		return n >= 4
	}, testTimeout, poll)
	b.stop(r)
	require.Empty(t, b.callsOf("once"))
	require.Empty(t, b.parked())
	require.Zero(t, b.settledCount())

	r = b.start(nil, nil)
	b.waitSettled("ok", "done")
	b.waitSettled("once", "done")
	b.waitSettled("perm", "park")
	b.stop(r)
	require.Equal(t, []int{1, 2}, b.attemptsOf("once"))
	require.Equal(t, 1, b.parked()["perm"].Attempts)
}
