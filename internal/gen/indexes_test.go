package gen_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
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
	before := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(src.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "0003_") {
			return err
		}
		b, err := fs.ReadFile(src.FS, p)
		before[p] = &fstest.MapFile{Data: b}
		return err
	}))
	require.Len(t, before, 2, "the create and states files")
	require.NoError(t, schema.Migrate(ctx, pool, schema.Source{Name: src.Name, FS: before}))
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
		"saga_place_order_due_at":           " USING btree (LEAST(timeout_at, deadline_at)) WHERE (LEAST(timeout_at, deadline_at) IS NOT NULL)",
		"saga_place_order_created_at":       " USING btree (created_at, id)",
	}, got)
	require.Equal(t, created, oid("saga_place_order_created_at"), "the valid index built beforehand is kept")
}
