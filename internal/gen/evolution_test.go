package gen_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/internal/gen/regen"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

// nextPlaceOrderMigrations generates the Place Order example from its
// contract changed by edit (applied to order.proto's text) and returns the
// saga's migrations as the regenerated code embeds them.
func nextPlaceOrderMigrations(t *testing.T, edit func(string) string) schema.Source {
	t.Helper()
	repo := t.TempDir()
	for _, dir := range []string{"options", "examples/placeorder"} {
		src := filepath.Join(repoRoot, dir)
		require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".proto") {
				return err
			}
			rel, err := filepath.Rel(repoRoot, p)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if strings.HasSuffix(p, filepath.Join("order", "v1", "order.proto")) {
				changed := edit(string(b))
				require.NotEqual(t, string(b), changed, "the edit changes the contract")
				b = []byte(changed)
			}
			require.NoError(t, os.MkdirAll(filepath.Join(repo, filepath.Dir(rel)), 0o755))
			return os.WriteFile(filepath.Join(repo, rel), b, 0o644)
		}))
	}
	var target regen.Target
	for _, tg := range regen.Targets() {
		if tg.Name == "placeorder" {
			target = tg
		}
	}
	files, err := regen.Generate(context.Background(), repo, target)
	require.NoError(t, err)
	const dir = "examples/placeorder/shop/order/v1/migrations/saga_place_order/"
	next := fstest.MapFS{}
	for name, b := range files {
		if strings.HasPrefix(name, dir) {
			next[strings.TrimPrefix(name, dir)] = &fstest.MapFile{Data: b}
		}
	}
	return schema.Source{Name: orderv1.PlaceOrderMigrations().Name, FS: next}
}

// withoutStep removes the step named name from the saga option.
func withoutStep(name string) func(string) string {
	return func(s string) string {
		i := strings.Index(s, "name: \""+name+"\"")
		start := strings.LastIndex(s[:i], "steps: {")
		end := start + strings.Index(s[start:], "}") + 1
		return s[:start] + s[end:]
	}
}

func insertInstance(t *testing.T, pool *pgxpool.Pool, id, key, state string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO saga_place_order (id, business_key, state, data) VALUES ($1, $2, $3, '\x')`, id, key, state)
	require.NoError(t, err)
}

// TestStatesMigrationOfARegeneratedContract removes a step from the
// example's contract and applies the migrations the regenerated code embeds
// (the first release's states file is no longer among them) over the
// database the first release migrated: refused, naming table and state,
// while an instance waits in the step; applied once every instance in it has
// ended (terminal states are in every state set).
func TestStatesMigrationOfARegeneratedContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "o-1", "APPROVE_ORDER")
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000002", "o-2", "COMPLETED")

	next := nextPlaceOrderMigrations(t, withoutStep("ApproveOrder"))
	err := schema.Migrate(ctx, pool, next)
	require.ErrorContains(t, err, "instances of saga_place_order are in states the new definition removes: APPROVE_ORDER")

	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'COMPLETED' WHERE business_key = 'o-1'`)
	require.NoError(t, err)
	require.NoError(t, schema.Migrate(ctx, pool, next))
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'APPROVE_ORDER' WHERE business_key = 'o-1'`)
	require.ErrorContains(t, err, "saga_place_order_state_check")
}

// intoGroup makes the steps named members a parallel group named group.
func intoGroup(group string, members ...string) func(string) string {
	return func(s string) string {
		for _, m := range members {
			i := strings.Index(s, "name: \""+m+"\"")
			s = s[:i] + "group: \"" + group + "\"\n      " + s[i:]
		}
		i := strings.Index(s, "callback: {")
		return s[:i] + "groups: {name: \"" + group + "\", timeout: \"10m\"}\n    " + s[i:]
	}
}

// TestStatesMigrationOfAGroupAdded: running two steps as a parallel group
// replaces their states with the group's; the states migration is refused
// while an instance waits in one of the members' old states, and applied
// once none does, after which the group's state is accepted.
func TestStatesMigrationOfAGroupAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "o-1", "SCHEDULE_SHIPPING")

	next := nextPlaceOrderMigrations(t, intoGroup("Fulfil", "ScheduleShipping", "ApproveOrder"))
	err := schema.Migrate(ctx, pool, next)
	require.ErrorContains(t, err, "instances of saga_place_order are in states the new definition removes: SCHEDULE_SHIPPING")

	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'COMPLETED' WHERE business_key = 'o-1'`)
	require.NoError(t, err)
	require.NoError(t, schema.Migrate(ctx, pool, next))
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'FULFIL' WHERE business_key = 'o-1'`)
	require.NoError(t, err, "the group's state is a state of the new definition")
	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'APPROVE_ORDER' WHERE business_key = 'o-1'`)
	require.ErrorContains(t, err, "saga_place_order_state_check", "a member has no state of its own")
}

// TestStatesMigrationRefusesAStateEnteredMeanwhile: an instance that enters
// a removed state while the states migration runs (its check has passed, a
// writer still holds the row) does not end up behind the new constraint:
// the constraint's validation, after the writer committed, refuses the
// migration.
func TestStatesMigrationRefusesAStateEnteredMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "o-1", "SCHEDULE_SHIPPING")
	next := nextPlaceOrderMigrations(t, withoutStep("ApproveOrder"))

	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer writer.Rollback(ctx)
	_, err = writer.Exec(ctx, `UPDATE saga_place_order SET state = 'APPROVE_ORDER' WHERE business_key = 'o-1'`)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- schema.Migrate(ctx, pool, next) }()
	// Wait until the migration waits for the writer's lock on the table.
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'saga_place_order'::regclass)`).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, writer.Commit(ctx))
	err = <-migrated
	t.Logf("migration: %v", err)
	require.ErrorContains(t, err, "saga_place_order_state_check")
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_schema_sources WHERE name LIKE '0002_states_%'`).Scan(&applied))
	require.Equal(t, 1, applied, "only the first release's states file is applied")
}

// TestCheckStatesAfterARollback: release A, then B (ApproveOrder renamed
// ConfirmOrder), then A again. A's states file is already recorded, so its
// migration applies nothing and the constraint keeps B's states; the
// engine's start-up check finds the instance in B's state and A's state the
// constraint refuses.
func TestCheckStatesAfterARollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a := orderv1.PlaceOrderMigrations()
	require.NoError(t, schema.Migrate(ctx, pool, a))
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool}, placeOrder{})
	require.NoError(t, err)
	require.NoError(t, po.Engine().CheckStates(ctx))

	b := nextPlaceOrderMigrations(t, func(s string) string {
		return strings.Replace(s, `name: "ApproveOrder"`, `name: "ConfirmOrder"`, 1)
	})
	require.NoError(t, schema.Migrate(ctx, pool, b))
	insertInstance(t, pool, "018f0000-0000-7000-8000-000000000001", "o-1", "CONFIRM_ORDER")

	require.NoError(t, schema.Migrate(ctx, pool, a), "A's states file is recorded: nothing runs")
	err = po.Engine().CheckStates(ctx)
	require.ErrorIs(t, err, saga.ErrStatesMismatch)
	require.ErrorContains(t, err, "table saga_place_order: instances in states the definition does not have: CONFIRM_ORDER (1)")
	require.ErrorContains(t, err, "states of the definition its state constraint refuses: APPROVE_ORDER")

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_place_order`).Scan(&n))
	require.Equal(t, 1, n, "the check writes nothing")
}
