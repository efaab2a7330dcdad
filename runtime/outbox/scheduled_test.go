package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
)

// TestScheduleMovesDueRowsOnce: scheduled rows stay out of the outbox
// until due; movers running at once move each due row exactly once and
// leave the rows not yet due.
func TestScheduleMovesDueRowsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	typ := sagatest.NewType("test.Reminder", message.KindEvent)
	typ.TimeToBeReceived = time.Minute
	base := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	const due, later = 300, 5
	ids := map[string]bool{}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range due + later {
			at := base.Add(time.Duration(i) * time.Millisecond)
			if i >= due {
				at = base.Add(time.Hour)
			}
			id, err := outbox.Schedule(ctx, tx, sagatest.NewMessage(typ, fmt.Sprint(i)), message.Meta{OccurredAt: base.Add(-time.Hour)}, at)
			if err != nil {
				return err
			}
			if i < due {
				ids[id] = true
			}
		}
		return nil
	}))
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	require.Zero(t, count(`SELECT count(*) FROM saga_outbox`), "nothing is in the outbox before it is due")
	n, err := outbox.MoveDue(ctx, pool, base.Add(-time.Second), 100)
	require.NoError(t, err)
	require.Zero(t, n)

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				n, err := outbox.MoveDue(ctx, pool, base.Add(time.Minute), 7)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, due, count(`SELECT count(*) FROM saga_outbox`))
	require.Equal(t, due, count(`SELECT count(DISTINCT message_id) FROM saga_outbox`))
	require.Equal(t, due, count(`SELECT count(*) FROM saga_outbox_pending`), "moved rows are pending for the relay")
	require.Equal(t, later, count(`SELECT count(*) FROM saga_outbox_scheduled`))
	rows, err := pool.Query(ctx, `SELECT message_id, headers->>'`+message.HeaderExpiresAt+`' FROM saga_outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id, exp string
		require.NoError(t, rows.Scan(&id, &exp))
		require.True(t, ids[id], "moved %s, which was not due", id)
		at, err := time.Parse(time.RFC3339Nano, exp)
		require.NoError(t, err)
		require.True(t, at.After(base), "the expiry counts from the due time, not from when it was written: %s", exp)
	}
	require.NoError(t, rows.Err())
}
