package schema

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

// TestOutboxPendingUpgrade: a database as release 0006 left it, with free,
// leased and published outbox rows and a writer's insert not yet
// committed, keeps each row's state through 0007;
// afterwards every inserted row is pending, however it was written, and a
// relay of the old release fails at its claim instead of publishing every
// row again.
func TestOutboxPendingUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, migrate(ctx, pool, 6, nil))

	publishedAt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var free, leased, published int64
	insert := `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at,
  attempts, lease_owner, lease_until, published_at)
VALUES ($1, 'x', 'k', 't', 1, '\x00', now(), $2, $3, $4, $5) RETURNING id`
	require.NoError(t, pool.QueryRow(ctx, insert, "free", 0, nil, nil, nil).Scan(&free))
	require.NoError(t, pool.QueryRow(ctx, insert, "leased", 2, "r1", time.Now().Add(time.Hour), nil).Scan(&leased))
	require.NoError(t, pool.QueryRow(ctx, insert, "published", 1, "r2", publishedAt.Add(-time.Second), publishedAt).Scan(&published))

	// A writer of the old release is inside its transaction, its row
	// inserted, when the migration starts; it commits while the migration
	// waits. Its row must not fall between the copy and the trigger.
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	var inFlight int64
	require.NoError(t, writer.QueryRow(ctx, insert, "in-flight", 0, nil, nil, nil).Scan(&inFlight))
	migrated := make(chan error, 1)
	go func() { migrated <- Migrate(ctx, pool) }()
	testenv.WaitBlocked(t, pool, "%saga_outbox_pending%") // the migration waits for the writer
	require.NoError(t, writer.Commit(ctx))
	require.NoError(t, <-migrated)

	type pendingRow struct {
		ID       int64
		Attempts int
		Owner    *string
		Leased   bool
	}
	rows, err := pool.Query(ctx, `SELECT id, attempts, lease_owner, coalesce(lease_until > now(), false) FROM saga_outbox_pending ORDER BY id`)
	require.NoError(t, err)
	pending, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pendingRow])
	require.NoError(t, err)
	r1 := "r1"
	require.Equal(t, []pendingRow{{ID: free}, {ID: leased, Attempts: 2, Owner: &r1, Leased: true}, {ID: inFlight}}, pending,
		"unpublished rows stay unpublished, a lease stays with its relay")

	var (
		sentID       int64
		sentAt       time.Time
		sentAttempts int
		relay        string
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT id, published_at, attempts, relay FROM saga_outbox_sent`).
		Scan(&sentID, &sentAt, &sentAttempts, &relay))
	require.Equal(t, published, sentID)
	require.True(t, publishedAt.Equal(sentAt), "published at %s, recorded %s", publishedAt, sentAt)
	require.Equal(t, 1, sentAttempts)
	require.Equal(t, "r2", relay)

	// Rows written by plain SQL, several in one statement, are pending with
	// the lease they were written with.
	_, err = pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at,
  attempts, lease_owner, lease_until)
VALUES ('by-hand-1', 'x', 'k', 't', 1, '\x00', now(), 0, NULL, NULL),
       ('by-hand-2', 'x', 'k', 't', 1, '\x00', now(), 1, 'local', now() + interval '1 minute'),
       ('by-hand-3', 'x', 'k', 't', 1, '\x00', now(), 0, NULL, NULL)`)
	require.NoError(t, err)
	type stateRow struct {
		MessageID  string
		Pending    bool
		Owner      *string
		BornLeased bool
	}
	rows, err = pool.Query(ctx, `SELECT message_id, pending, lease_owner, born_leased FROM saga_outbox_state ORDER BY id`)
	require.NoError(t, err)
	state, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stateRow])
	require.NoError(t, err)
	local := "local"
	require.Equal(t, []stateRow{
		{MessageID: "free", Pending: true},
		{MessageID: "leased", Pending: true, Owner: &r1, BornLeased: true},
		{MessageID: "published", BornLeased: true},
		{MessageID: "in-flight", Pending: true},
		{MessageID: "by-hand-1", Pending: true},
		{MessageID: "by-hand-2", Pending: true, Owner: &local, BornLeased: true},
		{MessageID: "by-hand-3", Pending: true},
	}, state)

	// The old release's claim names the dropped column.
	_, err = pool.Exec(ctx, `UPDATE saga_outbox SET lease_owner = 'old', attempts = attempts + 1
WHERE published_at IS NULL AND (lease_until IS NULL OR lease_until < now())`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "an old relay's claim must fail, got %v", err)
	require.Equal(t, "42703", pgErr.Code, "undefined column: %v", err)
}

// TestInboxIndexUpgrade: migration 0008 builds saga_inbox_by_age; one an
// operator built beforehand is kept, and one a failed concurrent build
// left invalid is built again.
func TestInboxIndexUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	index := func(t *testing.T, pool interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (def string, valid bool) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(c.oid), i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = 'saga_inbox_by_age' AND c.relnamespace = current_schema()::regnamespace`).Scan(&def, &valid)
		require.NoError(t, err)
		return def, valid
	}
	// migrated runs every migration and requires the index built as 0008
	// builds it, and valid.
	migrated := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		require.NoError(t, Migrate(ctx, pool))
		def, valid := index(t, pool)
		require.Regexp(t, `^CREATE INDEX saga_inbox_by_age ON \S+\.saga_inbox USING btree \(consumer, received_at\)$`, def)
		require.True(t, valid)
	}

	t.Run("Fresh", func(t *testing.T) {
		t.Parallel()
		migrated(t, testenv.Postgres(t))
	})

	t.Run("InvalidLeftByAFailedConcurrentBuild", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		require.NoError(t, migrate(ctx, pool, 7, nil))
		_, err := pool.Exec(ctx, `INSERT INTO saga_inbox (consumer, message_id) VALUES ('a', '1'), ('a', '2')`)
		require.NoError(t, err)
		// A unique build over duplicate consumers fails and leaves the
		// index behind, invalid.
		_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY saga_inbox_by_age ON saga_inbox (consumer)`)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code)
		_, valid := index(t, pool)
		require.False(t, valid)
		migrated(t, pool)
	})

	t.Run("BuiltBeforehand", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		require.NoError(t, migrate(ctx, pool, 7, nil))
		_, err := pool.Exec(ctx, `CREATE INDEX CONCURRENTLY saga_inbox_by_age ON saga_inbox (consumer, received_at)`)
		require.NoError(t, err)
		var oid uint32
		require.NoError(t, pool.QueryRow(ctx, `SELECT 'saga_inbox_by_age'::regclass::oid`).Scan(&oid))
		require.NoError(t, Migrate(ctx, pool))
		var after uint32
		require.NoError(t, pool.QueryRow(ctx, `SELECT 'saga_inbox_by_age'::regclass::oid`).Scan(&after))
		require.Equal(t, oid, after, "the index built beforehand was built again")
	})
}
