package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	signupv1 "github.com/protosaga/saga/testdata/golden/choreo/signup/v1"
)

// TestScheduledAndExpiringMessages: a message past its time to be received
// is parked with the reason "expired" and not handled; a scheduled message
// is durable in PostgreSQL: the host that wrote it stops before it is due,
// another host on the same database and broker starts, and the message is
// delivered once, when due, with its expiry counted from that time.
func TestScheduledAndExpiringMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	amqpURL := testenv.AMQP(t)
	_, err := pool.Exec(ctx, `CREATE TABLE mails (account_id text PRIMARY KEY, email text NOT NULL);
CREATE TABLE ledger (kind text NOT NULL, account_id text NOT NULL, message_id text NOT NULL, causation_id text NOT NULL);
CREATE TABLE reminders (account_id text NOT NULL)`)
	require.NoError(t, err)
	start := func() *host.Host {
		h, err := host.New(ctx, host.Config{Service: "signup", Pool: pool, AMQPURL: amqpURL, HTTPAddr: host.HTTPOff})
		require.NoError(t, err)
		require.NoError(t, signupv1.RegisterMailerSubscriber(h, &mailer{}))
		require.NoError(t, signupv1.RegisterLedgerSubscriber(h, ledger{}))
		require.NoError(t, h.Start(ctx))
		return h
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	tx := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, fn))
	}

	first := start()
	firstStopped := false
	t.Cleanup(func() {
		if !firstStopped {
			require.NoError(t, first.Stop(ctx))
		}
	})
	var staleID string
	tx(func(tx pgx.Tx) error {
		// Sent three minutes ago with a time to be received of two.
		staleID, err = signupv1.PublishTrialReminder(ctx, tx, &signupv1.TrialReminder{AccountId: "stale"},
			message.Meta{OccurredAt: time.Now().Add(-3 * time.Minute)})
		if err != nil {
			return err
		}
		_, err = signupv1.PublishTrialReminder(ctx, tx, &signupv1.TrialReminder{AccountId: "fresh"}, message.Meta{})
		return err
	})
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM reminders WHERE account_id = 'fresh'`) == 1 &&
			count(`SELECT count(*) FROM saga_parked WHERE message_id = $1`, staleID) == 1
	}, 30*time.Second, 50*time.Millisecond)
	var reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT reason FROM saga_parked WHERE message_id = $1`, staleID).Scan(&reason))
	require.Contains(t, reason, "expired: message "+staleID)
	require.Zero(t, count(`SELECT count(*) FROM reminders WHERE account_id = 'stale'`), "an expired message is not handled")

	// Crash point: scheduled rows are written, the process goes away
	// before they are due.
	due := time.Now().Add(3 * time.Second)
	var openedID, reminderID string
	tx(func(tx pgx.Tx) error {
		openedID, err = signupv1.ScheduleAccountOpened(ctx, tx, &signupv1.AccountOpened{AccountId: "later", Email: "later@example.com"}, message.Meta{}, due)
		if err != nil {
			return err
		}
		// Written three minutes "ago": its expiry counts from due, so it is
		// handled.
		reminderID, err = signupv1.ScheduleTrialReminder(ctx, tx, &signupv1.TrialReminder{AccountId: "later"},
			message.Meta{OccurredAt: time.Now().Add(-3 * time.Minute)}, due)
		return err
	})
	require.NoError(t, first.Stop(ctx))
	firstStopped = true
	require.Equal(t, 2, count(`SELECT count(*) FROM saga_outbox_scheduled WHERE message_id IN ($1, $2)`, openedID, reminderID))
	require.Zero(t, count(`SELECT count(*) FROM saga_outbox WHERE message_id IN ($1, $2)`, openedID, reminderID), "not published before due")
	require.Zero(t, count(`SELECT count(*) FROM ledger WHERE account_id = 'later'`))

	second := start()
	t.Cleanup(func() { require.NoError(t, second.Stop(ctx)) })
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM reminders WHERE account_id = 'later'`) == 1 &&
			count(`SELECT count(*) FROM ledger WHERE account_id = 'later'`) == 2
	}, 30*time.Second, 50*time.Millisecond)
	var published time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT s.published_at FROM saga_outbox_sent s JOIN saga_outbox o USING (id) WHERE o.message_id = $1`, openedID).Scan(&published))
	require.False(t, published.Before(due), "published at %s, due at %s", published, due)
	require.Zero(t, count(`SELECT count(*) FROM saga_outbox_scheduled`))
	require.Equal(t, 1, count(`SELECT count(*) FROM saga_outbox WHERE message_id = $1`, openedID), "moved into the outbox once")
	require.Equal(t, 2, count(`SELECT count(*) FROM saga_inbox WHERE message_id = $1`, openedID), "handled by each subscriber")
	require.Equal(t, 1, count(`SELECT count(*) FROM mails WHERE account_id = 'later'`))
	require.Zero(t, count(`SELECT count(*) FROM saga_parked WHERE message_id = $1`, reminderID))
}
