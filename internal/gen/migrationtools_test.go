package gen_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // the pgx5:// database driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver goose runs on
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

// toolDatabase returns a fresh schema as a pgx pool and as the URL the
// migration tools connect with.
func toolDatabase(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, dsn
}

// startPlaceOrder checks the Place Order engine's view of its table and
// starts an instance: its row is written in the first step's state and its
// first command in the outbox.
func startPlaceOrder(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool}, placeOrder{})
	require.NoError(t, err)
	require.NoError(t, po.Engine().CheckStates(ctx))
	id, created, err := po.Start(ctx, placeOrderRequest(), message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM saga_place_order WHERE id = $1`, id).Scan(&state))
	require.Equal(t, "RESERVE_INVENTORY", state)
	var sent int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE message_type = 'shop.inventory.v1.ReserveInventory'`).Scan(&sent))
	require.Equal(t, 1, sent)
}

// toolSources are what a service running both example sagas and
// participant.Idempotent exports, after the runtime's own.
func toolSources(placeOrder schema.Source) []schema.Source {
	return []schema.Source{participant.Migrations, placeOrder, quotev1.QuoteApprovalMigrations()}
}

// TestGooseAppliesExportedMigrations: the runtime's and two sagas'
// migrations, exported after a migration of the team's own, are applied
// by goose, and the Place Order engine runs on the result. A contract
// change exports one new states file, after everything; goose refuses it,
// with the states migration's message, while an instance occupies the
// state it removes, and applies it once the instance has ended.
func TestGooseAppliesExportedMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dsn := toolDatabase(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00001_accounts.sql"), []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n"), 0o600))
	opts := schema.ExportOptions{Dir: dir, Format: schema.Goose}
	exported, err := schema.Export(opts, toolSources(orderv1.PlaceOrderMigrations())...)
	require.NoError(t, err)
	require.Equal(t, int64(2), exported[0].Version)

	up := func() ([]*goose.MigrationResult, error) {
		t.Helper()
		p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir))
		require.NoError(t, err)
		return p.Up(ctx)
	}
	version := func() int64 {
		t.Helper()
		p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir))
		require.NoError(t, err)
		v, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		return v
	}
	results, err := up()
	require.NoError(t, err)
	require.Len(t, results, len(exported)+1, "the team's migration and every exported one")
	last := exported[len(exported)-1]
	require.Equal(t, last.Version, version())
	startPlaceOrder(t, pool)
	qa, err := quotev1.NewQuoteApproval(saga.Config{Pool: pool}, quoteApproval{})
	require.NoError(t, err)
	require.NoError(t, qa.Engine().CheckStates(ctx))

	next := nextPlaceOrderMigrations(t, withoutStep("ApproveOrder"))
	added, err := schema.Export(opts, toolSources(next)...)
	require.NoError(t, err)
	require.Len(t, added, 1, "the new states file only")
	require.True(t, strings.HasPrefix(added[0].Name, "0002_states_"), added[0].Name)
	require.Equal(t, last.Version+1, added[0].Version)

	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "waiting-1", "APPROVE_ORDER")
	_, err = up()
	require.ErrorContains(t, err, "instances of saga_place_order are in states the new definition removes: APPROVE_ORDER")
	require.Equal(t, last.Version, version(), "the refused file is not recorded")

	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'COMPLETED' WHERE business_key = 'waiting-1'`)
	require.NoError(t, err)
	results, err = up()
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Equal(t, added[0].Version, version())
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'APPROVE_ORDER' WHERE business_key = 'waiting-1'`)
	require.ErrorContains(t, err, "saga_place_order_state_check")
}

// TestGolangMigrateAppliesExportedMigrations: the same files exported for
// golang-migrate, recorded in a version table of their own
// (x-migrations-table), are applied by golang-migrate, and the Place Order
// engine runs on the result. A refused states file leaves the database
// dirty at its version, as golang-migrate does with any failed file: once
// the instance has ended, forcing the previous version and migrating again
// applies it.
func TestGolangMigrateAppliesExportedMigrations(t *testing.T) {
	t.Parallel()
	pool, dsn := toolDatabase(t)
	dir := t.TempDir()
	opts := schema.ExportOptions{Dir: dir, Format: schema.GolangMigrate}
	exported, err := schema.Export(opts, toolSources(orderv1.PlaceOrderMigrations())...)
	require.NoError(t, err)
	require.Equal(t, int64(1), exported[0].Version)

	databaseURL := "pgx5" + strings.TrimPrefix(dsn, "postgres") + "&x-migrations-table=saga_migrate_versions"
	open := func() *migrate.Migrate {
		t.Helper()
		src, err := iofs.New(os.DirFS(dir), ".")
		require.NoError(t, err)
		m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = m.Close() })
		return m
	}
	require.NoError(t, open().Up())
	last := exported[len(exported)-1]
	v, dirty, err := open().Version()
	require.NoError(t, err)
	require.Equal(t, uint(last.Version), v)
	require.False(t, dirty)
	startPlaceOrder(t, pool)

	next := nextPlaceOrderMigrations(t, withoutStep("ApproveOrder"))
	added, err := schema.Export(opts, toolSources(next)...)
	require.NoError(t, err)
	require.Len(t, added, 1, "the new states file only")
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "waiting-1", "APPROVE_ORDER")
	err = open().Up()
	require.ErrorContains(t, err, "instances of saga_place_order are in states the new definition removes: APPROVE_ORDER")
	v, dirty, err = open().Version()
	require.NoError(t, err)
	require.Equal(t, uint(added[0].Version), v)
	require.True(t, dirty)

	ctx := context.Background()
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'COMPLETED' WHERE business_key = 'waiting-1'`)
	require.NoError(t, err)
	m := open()
	require.NoError(t, m.Force(int(last.Version)))
	require.NoError(t, m.Up())
	v, dirty, err = m.Version()
	require.NoError(t, err)
	require.Equal(t, uint(added[0].Version), v)
	require.False(t, dirty)
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'APPROVE_ORDER' WHERE business_key = 'waiting-1'`)
	require.ErrorContains(t, err, "saga_place_order_state_check")
}
