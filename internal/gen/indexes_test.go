package gen_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/schema"
)

// TestIndexesMigrationUpgrades applies the Place Order migrations as a
// release before 0003_indexes.sql left them, with instances in the table and
// the two new indexes built beforehand as the file's header suggests: one
// concurrent build failed (an invalid index), the other succeeded. The file
// then rebuilds the invalid one, keeps the valid one, and drops the two
// indexes it replaces.
func TestIndexesMigrationUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	src := orderv1.PlaceOrderMigrations()
	migrateBeforeIndexes(t, pool)
	_, err := pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data, timeout_at, deadline_at)
SELECT gen_random_uuid(), 'o-' || i, 'RESERVE_INVENTORY', '\x', now() + i * interval '1 s', NULL
FROM generate_series(1, 100) i`)
	require.NoError(t, err)

	// A unique index over duplicate states fails its concurrent build and
	// stays behind, invalid, under the due index's name.
	_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY saga_place_order_due_at ON saga_place_order (state)`)
	require.ErrorContains(t, err, "could not create unique index")
	_, err = pool.Exec(ctx, `CREATE INDEX CONCURRENTLY saga_place_order_created_at ON saga_place_order (created_at, id)`)
	require.NoError(t, err)
	oid := func(name string) (id uint32) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT $1::regclass::oid`, name).Scan(&id))
		return id
	}
	created := oid("saga_place_order_created_at")

	require.NoError(t, schema.Migrate(ctx, pool, src))
	type index struct {
		Name  string
		Valid bool
		Def   string
	}
	rows, err := pool.Query(ctx, `SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'saga_place_order'::regclass`)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[index])
	require.NoError(t, err)
	got := map[string]string{}
	for _, ix := range indexes {
		require.True(t, ix.Valid, ix.Name)
		got[ix.Name] = ix.Def[strings.Index(ix.Def, " USING "):]
	}
	require.Equal(t, map[string]string{
		"saga_place_order_pkey":             " USING btree (id)",
		"saga_place_order_business_key_key": " USING btree (business_key)",
		"saga_place_order_state":            " USING btree (state)",
		"saga_place_order_due_at":           " USING btree (LEAST(timeout_at, deadline_at)) WHERE ((LEAST(timeout_at, deadline_at) IS NOT NULL) AND (state <> 'MANUAL_REVIEW'::text))",
		"saga_place_order_created_at":       " USING btree (created_at, id)",
	}, got)
	require.Equal(t, created, oid("saga_place_order_created_at"), "the valid index built beforehand is kept")
}

// TestIndexesMigrationInAQuotedSchema applies the Place Order migrations in a
// schema whose name needs quoting, after an invalid due index was left
// there by a failed concurrent build: the file finds that index through its
// table, wherever the table is, and rebuilds it.
func TestIndexesMigrationInAQuotedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	require.NoError(t, err)
	schemaName := "Quoted " + cfg.ConnConfig.RuntimeParams["search_path"]
	quoted := pgx.Identifier{schemaName}.Sanitize()
	cfg.ConnConfig.RuntimeParams["search_path"] = quoted
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+quoted)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+quoted+` CASCADE`) })

	files, err := fs.Glob(orderv1.PlaceOrderMigrations().FS, "*.sql")
	require.NoError(t, err)
	require.Len(t, files, 3)
	apply := func(name string) {
		t.Helper()
		b, err := fs.ReadFile(orderv1.PlaceOrderMigrations().FS, name)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(b))
		require.NoError(t, err, name)
	}
	apply(files[0])
	apply(files[1])
	_, err = pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data)
SELECT gen_random_uuid(), 'o-' || i, 'RESERVE_INVENTORY', '\x' FROM generate_series(1, 10) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY saga_place_order_due_at ON saga_place_order (state)`)
	require.ErrorContains(t, err, "could not create unique index")
	apply(files[2])

	var valid bool
	var def string
	require.NoError(t, pool.QueryRow(ctx, `SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i
WHERE i.indexrelid = 'saga_place_order_due_at'::regclass`).Scan(&valid, &def))
	require.True(t, valid, def)
	require.Contains(t, def, "LEAST(timeout_at, deadline_at)")
}

// TestIndexesMigrationRebuildsAWrongDefinition applies the Place Order
// migrations over indexes of the right names built otherwise (the due index
// without the manual review predicate, as the file's first version had it;
// the created index on created_at alone): both are rebuilt as the runtime's
// queries need them, instead of being kept because of their names. A
// relation of either name that is not an index of the table stops the file.
func TestIndexesMigrationRebuildsAWrongDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := orderv1.PlaceOrderMigrations()
	pool := testenv.Postgres(t)
	migrateBeforeIndexes(t, pool)
	for _, q := range []string{
		`CREATE INDEX CONCURRENTLY saga_place_order_due_at ON saga_place_order ((least(timeout_at, deadline_at))) WHERE least(timeout_at, deadline_at) IS NOT NULL`,
		`CREATE INDEX CONCURRENTLY saga_place_order_created_at ON saga_place_order (created_at)`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	require.NoError(t, schema.Migrate(ctx, pool, src))
	for name, want := range map[string]string{
		"saga_place_order_due_at":     " USING btree (LEAST(timeout_at, deadline_at)) WHERE ((LEAST(timeout_at, deadline_at) IS NOT NULL) AND (state <> 'MANUAL_REVIEW'::text))",
		"saga_place_order_created_at": " USING btree (created_at, id)",
	} {
		var def string
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_indexdef($1::regclass)`, name).Scan(&def))
		require.Equal(t, want, def[strings.Index(def, " USING "):], name)
	}

	other := testenv.Postgres(t)
	migrateBeforeIndexes(t, other)
	_, err := other.Exec(ctx, `CREATE TABLE saga_place_order_due_at (id int)`)
	require.NoError(t, err)
	require.ErrorContains(t, schema.Migrate(ctx, other, src), "saga_place_order_due_at is not an index of saga_place_order")
}

// migrateBeforeIndexes applies the runtime's migrations and the Place Order
// files before 0003_indexes.sql (the table and its states), as the release
// before that file left a database.
func migrateBeforeIndexes(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	src := orderv1.PlaceOrderMigrations()
	before := placeOrderFiles(t, func(name string) bool { return !strings.HasPrefix(name, "0003_") })
	require.Len(t, before, 2, "the create and states files")
	require.NoError(t, schema.Migrate(context.Background(), pool, schema.Source{Name: src.Name, FS: before}))
}

// placeOrderFiles copies the Place Order example's migrations that keep
// accepts, for tests that apply some of them or add a file of their own.
func placeOrderFiles(t *testing.T, keep func(name string) bool) fstest.MapFS {
	t.Helper()
	src := orderv1.PlaceOrderMigrations().FS
	out := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !keep(p) {
			return err
		}
		b, err := fs.ReadFile(src, p)
		out[p] = &fstest.MapFile{Data: b}
		return err
	}))
	return out
}
