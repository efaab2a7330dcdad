package schema_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/schema"
)

// counterSource is a source whose first file fails when applied twice (no IF
// NOT EXISTS) and whose second counts how often it ran.
func counterSource() fstest.MapFS {
	return fstest.MapFS{
		"0001_create.sql": {Data: []byte("CREATE TABLE applied_count (n integer NOT NULL);")},
		"0002_count.sql":  {Data: []byte("INSERT INTO applied_count VALUES (1);")},
		"README.md":       {Data: []byte("not a migration")},
	}
}

func count(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM applied_count").Scan(&n))
	return n
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	src := schema.Source{Name: "orders", FS: counterSource()}

	before, err := schema.Status(ctx, pool, src)
	require.NoError(t, err)
	runtime := runtimeMigrations(t)
	require.Len(t, before, len(runtime)+2)
	for _, m := range before {
		require.False(t, m.Applied, m.Name)
	}
	for i, name := range runtime {
		require.Equal(t, schema.Migration{Source: schema.RuntimeSource, Name: name, Version: i + 1, Checksum: before[i].Checksum}, before[i])
	}
	require.Equal(t, "0001_runtime_tables.sql", before[0].Name)
	orders := before[len(runtime):]
	require.Equal(t, "orders", orders[0].Source)
	require.Equal(t, "0001_create.sql", orders[0].Name)
	require.Equal(t, "0002_count.sql", orders[1].Name)

	require.NoError(t, schema.Migrate(ctx, pool, src))
	first, err := schema.Status(ctx, pool, src)
	require.NoError(t, err)
	for _, m := range first {
		require.True(t, m.Applied, m.Name)
		require.False(t, m.Changed, m.Name)
		require.False(t, m.AppliedAt.IsZero())
	}

	// The runtime tables exist and match the architecture's layout.
	_, err = pool.Exec(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
		VALUES ('m', 'x', 'k', 't', 1, '\x00', now())`)
	require.NoError(t, err)
	for _, table := range []string{"saga_inbox", "saga_audit", "saga_parked"} {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok))
		require.True(t, ok, table)
	}

	require.NoError(t, schema.Migrate(ctx, pool, src))
	require.Equal(t, 1, count(t, pool))
	second, err := schema.Status(ctx, pool, src)
	require.NoError(t, err)
	require.Equal(t, first, second, "a second run changes nothing, not even applied_at")

	// A new file is applied on the next run, and only it.
	next := counterSource()
	next["0003_more.sql"] = &fstest.MapFile{Data: []byte("INSERT INTO applied_count VALUES (3);")}
	require.NoError(t, schema.Migrate(ctx, pool, schema.Source{Name: "orders", FS: next}))
	require.Equal(t, 2, count(t, pool))
}

func TestMigrateConcurrentAppliersSerialize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	src := schema.Source{Name: "orders", FS: counterSource()}

	const n = 10
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = schema.Migrate(ctx, pool, src)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "applier %d", i)
	}
	require.Equal(t, 1, count(t, pool), "each file applied exactly once")
}

func TestMigrateRefusesChangedFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, schema.Source{Name: "orders", FS: counterSource()}))

	changed := counterSource()
	changed["0002_count.sql"] = &fstest.MapFile{Data: []byte("INSERT INTO applied_count VALUES (2);")}
	changed["0003_more.sql"] = &fstest.MapFile{Data: []byte("INSERT INTO applied_count VALUES (3);")}
	src := schema.Source{Name: "orders", FS: changed}
	err := schema.Migrate(ctx, pool, src)
	require.ErrorIs(t, err, schema.ErrChanged)
	require.ErrorContains(t, err, "migration orders/0002_count.sql was applied at")
	require.ErrorContains(t, err, "add a new migration file instead")
	require.Equal(t, 1, count(t, pool), "nothing applied while a file is changed")

	st, err := schema.Status(ctx, pool, src)
	require.NoError(t, err)
	n := len(runtimeMigrations(t))
	require.True(t, st[n+1].Changed)
	require.False(t, st[n+2].Applied)
}

func TestMigrateFailingFileRollsBackEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	bad := counterSource()
	bad["0003_bad.sql"] = &fstest.MapFile{Data: []byte("INSERT INTO no_such_table VALUES (1);")}
	err := schema.Migrate(ctx, pool, schema.Source{Name: "orders", FS: bad})
	require.ErrorContains(t, err, "apply migration orders/0003_bad.sql")

	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('saga_outbox') IS NOT NULL").Scan(&exists))
	require.False(t, exists, "the runtime tables were rolled back with the failing file")
}

func TestSourceValidation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Validation happens before any database access: a nil pool is never used.
	for name, srcs := range map[string][]schema.Source{
		"empty name":  {{FS: fstest.MapFS{}}},
		"reserved":    {{Name: schema.RuntimeSource, FS: fstest.MapFS{}}},
		"given twice": {{Name: "a", FS: fstest.MapFS{}}, {Name: "a", FS: fstest.MapFS{}}},
		"nil FS":      {{Name: "a"}},
	} {
		require.Error(t, schema.Migrate(ctx, nil, srcs...), name)
	}
}

// runtimeMigrations lists the runtime's embedded migration files in order.
func runtimeMigrations(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("migrations")
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			names = append(names, e.Name())
		}
	}
	require.NotEmpty(t, names)
	return names
}

// TestStatusListsWhatTheDatabaseRecorded: Status lists the migrations the
// database recorded that it was not given files for — a source not passed
// to it, a file no longer in its source, a runtime migration of a newer
// release — as applied, with NoFile set, after the files it was given.
func TestStatusListsWhatTheDatabaseRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	orders := schema.Source{Name: "orders", FS: counterSource()}
	stock := schema.Source{Name: "stock", FS: fstest.MapFS{"0001_stock.sql": {Data: []byte("CREATE TABLE stock (sku text);")}}}
	require.NoError(t, schema.Migrate(ctx, pool, stock, orders))
	_, err := pool.Exec(ctx, "INSERT INTO saga_schema_migrations (version, name, checksum) VALUES (9999, '9999_newer.sql', 'c0ffee')")
	require.NoError(t, err)

	type row struct {
		Source, Name            string
		Applied, NoFile, Change bool
	}
	rows := func(ms []schema.Migration) []row {
		var out []row
		for _, m := range ms {
			require.Equal(t, m.Applied, !m.AppliedAt.IsZero(), m.Name)
			out = append(out, row{m.Source, m.Name, m.Applied, m.NoFile, m.Changed})
		}
		return out
	}
	var runtime []row
	for _, name := range runtimeMigrations(t) {
		runtime = append(runtime, row{schema.RuntimeSource, name, true, false, false})
	}
	newer := row{schema.RuntimeSource, "9999_newer.sql", true, true, false}

	st, err := schema.Status(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, append(slices.Clone(runtime), newer,
		row{"orders", "0001_create.sql", true, true, false},
		row{"orders", "0002_count.sql", true, true, false},
		row{"stock", "0001_stock.sql", true, true, false},
	), rows(st))
	require.Equal(t, 9999, st[len(runtime)].Version)
	require.Equal(t, "c0ffee", st[len(runtime)].Checksum, "the recorded checksum")

	// orders given, without its first file (as a states file of an earlier
	// state set leaves its source).
	later := counterSource()
	delete(later, "0001_create.sql")
	later["0003_more.sql"] = &fstest.MapFile{Data: []byte("SELECT 1;")}
	st, err = schema.Status(ctx, pool, schema.Source{Name: "orders", FS: later})
	require.NoError(t, err)
	require.Equal(t, append(slices.Clone(runtime), newer,
		row{"orders", "0001_create.sql", true, true, false},
		row{"orders", "0002_count.sql", true, false, false},
		row{"orders", "0003_more.sql", false, false, false},
		row{"stock", "0001_stock.sql", true, true, false},
	), rows(st))
}

// TestMigrateRefusesAnotherToolsDatabase: on a database whose runtime
// tables another tool created (goose or golang-migrate applying exported
// files: no saga_schema_migrations), Migrate and Status refuse with
// ErrOtherTool instead of failing on a CREATE TABLE or listing every file
// as pending.
func TestMigrateRefusesAnotherToolsDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	src := schema.Source{Name: "orders", FS: counterSource()}
	require.NoError(t, schema.Migrate(ctx, pool, src))
	_, err := pool.Exec(ctx, "DROP TABLE saga_schema_migrations, saga_schema_sources")
	require.NoError(t, err)

	err = schema.Migrate(ctx, pool, src)
	require.ErrorIs(t, err, schema.ErrOtherTool)
	_, err = schema.Status(ctx, pool, src)
	require.ErrorIs(t, err, schema.ErrOtherTool)
	require.Equal(t, 1, count(t, pool), "nothing applied")
}
