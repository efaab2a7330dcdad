package outbox

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/schema"
)

// TestSettlePlanOnANewTable settles rows of a pending table that is new and
// has never been analyzed, as a relay's first settles do. The generic plan
// (the one a prepared statement keeps) must find the rows through the
// primary key, not read the whole table; and each row must be matched with
// its own entry of the parallel arrays: its claim's attempts, and the delay
// of a released row.
func TestSettlePlanOnANewTable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))

	// Seven rows: owner and attempts of each one's pending row.
	rows := []struct {
		name     string
		owner    *string
		attempts int32
	}{
		{"done", ptr("r1"), 1},
		{"done-claimed-again", ptr("r1"), 3},
		{"done-lease-cleared", nil, 3},
		{"done-other-owner", ptr("r2"), 1},
		{"failed-slow", ptr("r1"), 2},
		{"failed-fast", ptr("r1"), 1},
		{"failed-claimed-again", ptr("r1"), 2},
	}
	id := map[string]int64{}
	for _, r := range rows {
		var v int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at)
VALUES ($1, 'x', 'k', 't', 1, '\x', now()) RETURNING id`, r.name).Scan(&v))
		_, err := pool.Exec(ctx, `UPDATE saga_outbox_pending SET lease_owner = $2, lease_until = now() + interval '1 hour', attempts = $3 WHERE id = $1`,
			v, r.owner, r.attempts)
		require.NoError(t, err)
		id[r.name] = v
	}
	list := func(names ...string) string {
		ids := make([]string, len(names))
		for i, n := range names {
			ids[i] = fmt.Sprint(id[n])
		}
		return testenv.ArrayLiteral(ids...)
	}

	// Relay r1 settles four confirmed rows, the second of them under an
	// older claim (attempts 1; the row now has 3, the attempts of another
	// entry), and three failed rows, the second under an older claim (1
	// against 2).
	plan := testenv.GenericPlan(t, pool, settleSQL,
		list("done-lease-cleared", "done-claimed-again", "done", "done-other-owner"), testenv.ArrayLiteral("3", "1", "1", "1"), "'r1'",
		list("failed-fast", "failed-claimed-again", "failed-slow"), testenv.ArrayLiteral("1000", "5", "3600000"), testenv.ArrayLiteral("1", "1", "2"))
	require.NotContains(t, plan, "Seq Scan on saga_outbox_pending", "the settle's generic plan on a new table:\n%s", plan)
	require.Contains(t, plan, "saga_outbox_pending_pkey", "the settle's generic plan on a new table:\n%s", plan)
	plan = testenv.GenericPlan(t, pool, settleDoneSQL, testenv.ArrayLiteral("-1"), testenv.ArrayLiteral("1"), "'r1'")
	require.NotContains(t, plan, "Seq Scan on saga_outbox_pending", "the done rows' settle's generic plan on a new table:\n%s", plan)

	type pending struct {
		Name      string
		Owner     *string
		Attempts  int32
		WaitsSecs int64
	}
	rs, err := pool.Query(ctx, `SELECT o.message_id, p.lease_owner, p.attempts,
  round(extract(epoch FROM p.lease_until - now()))::bigint
FROM saga_outbox_pending p JOIN saga_outbox o USING (id) ORDER BY o.message_id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rs, pgx.RowToStructByPos[pending])
	require.NoError(t, err)
	want := []pending{
		{"done-claimed-again", ptr("r1"), 3, 3600},
		{"done-other-owner", ptr("r2"), 1, 3600},
		{"failed-claimed-again", ptr("r1"), 2, 3600},
		{"failed-fast", nil, 1, 1},
		{"failed-slow", nil, 2, 3600},
	}
	// Leases left alone were set an hour ahead when the rows were made, a
	// loaded machine's seconds ago: compare the waits within a few seconds.
	require.Len(t, got, len(want))
	for i := range want {
		require.InDelta(t, want[i].WaitsSecs, got[i].WaitsSecs, 5, "%s waits", want[i].Name)
		got[i].WaitsSecs = want[i].WaitsSecs
	}
	require.Equal(t, want, got)

	type sent struct {
		Name     string
		Attempts int32
		Relay    string
	}
	rs, err = pool.Query(ctx, `SELECT o.message_id, s.attempts, s.relay
FROM saga_outbox_sent s JOIN saga_outbox o USING (id) ORDER BY o.message_id`)
	require.NoError(t, err)
	recorded, err := pgx.CollectRows(rs, pgx.RowToStructByPos[sent])
	require.NoError(t, err)
	require.Equal(t, []sent{{"done", 1, "r1"}, {"done-lease-cleared", 3, "r1"}}, recorded)

	// A row whose settle lists it twice, under its older claim first, is
	// settled by its latest claim.
	r := &Relay{cfg: RelayConfig{Pool: pool, Owner: "r1", LeaseDuration: time.Minute, Now: time.Now, Logger: slog.New(slog.DiscardHandler)}}
	again := id["done-claimed-again"]
	require.NoError(t, r.settle(ctx, time.Now(), settlement{done: []int64{again, again}, doneAttempts: []int32{1, 3}}))
	require.EqualValues(t, 1, r.Stats().Published)
	var stillPending bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM saga_outbox_pending WHERE id = $1)`, again).Scan(&stillPending))
	require.False(t, stillPending, "a row listed twice was not settled by its latest claim")
}

// TestLatestClaims: a row listed twice keeps the entry of its latest claim
// (most attempts) with that claim's delay, in the position of its first
// entry; lists without a repeated id are returned as they are.
func TestLatestClaims(t *testing.T) {
	t.Parallel()
	ids, attempts, delays := latestClaims([]int64{7, 3, 7, 9, 3}, []int32{1, 4, 2, 1, 2}, []int64{10, 20, 30, 40, 50})
	require.Equal(t, []int64{7, 3, 9}, ids)
	require.Equal(t, []int32{2, 4, 1}, attempts)
	require.Equal(t, []int64{30, 20, 40}, delays)

	ids, attempts, delays = latestClaims([]int64{5, 5}, []int32{3, 2}, nil)
	require.Equal(t, []int64{5}, ids)
	require.Equal(t, []int32{3}, attempts)
	require.Nil(t, delays)

	in := []int64{1, 2, 3}
	ids, _, _ = latestClaims(in, []int32{1, 1, 1}, nil)
	require.Same(t, &in[0], &ids[0], "a list without repeats was copied")
}

func ptr[T any](v T) *T { return &v }
