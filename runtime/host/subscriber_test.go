package host_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/subscriber"
	signupv1 "github.com/protosaga/saga/testdata/golden/choreo/signup/v1"
)

// mailer sends a welcome mail per opened account: it records the mail and
// publishes WelcomeSent through the outbox in the handler's transaction.
// Account "flaky" fails its first delivery (retried through the tiers),
// account "stubborn" fails every delivery (parked when the retries are
// spent), account "poison" fails permanently (parked at once).
type mailer struct{ flaky atomic.Int32 }

func (m *mailer) AccountOpened(ctx context.Context, tx pgx.Tx, e *signupv1.AccountOpened) error {
	switch e.GetAccountId() {
	case "poison":
		return retry.Permanent(errors.New("mailbox does not exist"))
	case "stubborn":
		return errors.New("mail server unavailable")
	case "flaky":
		if m.flaky.Add(1) == 1 {
			return errors.New("mail server unavailable")
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mails (account_id, email) VALUES ($1, $2)`, e.GetAccountId(), e.GetEmail()); err != nil {
		return fmt.Errorf("record mail to %s: %w", e.GetAccountId(), err)
	}
	_, err := signupv1.PublishWelcomeSent(ctx, tx, &signupv1.WelcomeSent{AccountId: e.GetAccountId()}, subscriber.Meta(ctx))
	return err
}

func (m *mailer) TrialReminder(ctx context.Context, tx pgx.Tx, e *signupv1.TrialReminder) error {
	_, err := tx.Exec(ctx, `INSERT INTO reminders (account_id) VALUES ($1)`, e.GetAccountId())
	return err
}

// ledger records every event it handles with its message id and causation.
type ledger struct{}

func (ledger) record(ctx context.Context, tx pgx.Tx, kind, account string) error {
	env, ok := subscriber.Event(ctx)
	if !ok {
		return errors.New("no event envelope in the handler's context")
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger (kind, account_id, message_id, causation_id) VALUES ($1, $2, $3, $4)`,
		kind, account, env.MessageID, env.CausationID)
	return err
}

func (l ledger) AccountOpened(ctx context.Context, tx pgx.Tx, e *signupv1.AccountOpened) error {
	return l.record(ctx, tx, "opened", e.GetAccountId())
}

func (l ledger) WelcomeSent(ctx context.Context, tx pgx.Tx, e *signupv1.WelcomeSent) error {
	return l.record(ctx, tx, "welcome", e.GetAccountId())
}

// TestSubscribers runs two subscribing services of one event on a host
// against PostgreSQL and RabbitMQ: each handles every event once (also
// when the relay publishes a row again, as after a crash between its
// publish and its settle), a subscriber's own write and the event it
// publishes commit together and reach the other subscriber, a transient
// failure is retried through the tiers the contract declares for the
// queue (not the host's policy) and a permanent one is parked.
func TestSubscribers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	_, err := pool.Exec(ctx, `CREATE TABLE mails (account_id text PRIMARY KEY, email text NOT NULL);
CREATE TABLE ledger (kind text NOT NULL, account_id text NOT NULL, message_id text NOT NULL, causation_id text NOT NULL);
CREATE TABLE reminders (account_id text NOT NULL)`)
	require.NoError(t, err)
	h, err := host.New(ctx, host.Config{
		Service: "signup", Pool: pool, AMQPURL: testenv.AMQP(t), HTTPAddr: host.HTTPOff,
		Retry: retry.Policy{Tiers: []time.Duration{100 * time.Millisecond}, MaxAttempts: 3},
	})
	require.NoError(t, err)
	m := &mailer{}
	require.NoError(t, signupv1.RegisterMailerSubscriber(h, m))
	require.NoError(t, signupv1.RegisterLedgerSubscriber(h, ledger{}))
	topo := h.Topology()
	var queues []string
	for _, q := range topo.Queues {
		queues = append(queues, q.Name)
	}
	require.Contains(t, queues, "mailer.events.signup.v1")
	require.Contains(t, queues, "ledger.events.signup.v1")
	// The contract's retry {tiers: ["200ms", "1s"], max_attempts: 4}, not
	// the host's 100ms tier.
	require.Contains(t, queues, "mailer.events.signup.v1.retry.200ms")
	require.Contains(t, queues, "mailer.events.signup.v1.retry.1s")
	require.NotContains(t, queues, "mailer.events.signup.v1.retry.100ms")
	require.NoError(t, h.Start(ctx))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, h.Stop(ctx))
		}
	})

	ids := map[string]string{}
	for _, acct := range []string{"a-1", "a-2", "flaky", "poison", "stubborn"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := signupv1.PublishAccountOpened(ctx, tx, &signupv1.AccountOpened{AccountId: acct, Email: acct + "@example.com"}, message.Meta{})
			ids[acct] = id
			return err
		})
		require.NoError(t, err)
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	// Every account but poison and stubborn is mailed, and the ledger sees
	// both events of each; those two are opened in the ledger but parked by
	// the mailer.
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM mails`) == 3 &&
			count(`SELECT count(*) FROM ledger`) == 5+3 &&
			count(`SELECT count(*) FROM saga_parked WHERE queue = 'mailer.events.signup.v1'`) == 2
	}, 30*time.Second, 50*time.Millisecond)

	// The relay publishes a1's row again (it crashed after the broker
	// confirmed and before it recorded the publish): both subscribers see
	// the message id again and drop it.
	tag, err := pool.Exec(ctx, `WITH sent AS (
  DELETE FROM saga_outbox_sent s USING saga_outbox o WHERE s.id = o.id AND o.message_id = $1 RETURNING s.id)
INSERT INTO saga_outbox_pending (id) SELECT id FROM sent`, ids["a-1"])
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM saga_outbox_sent s JOIN saga_outbox o USING (id) WHERE o.message_id = $1`, ids["a-1"]) == 1
	}, 30*time.Second, 50*time.Millisecond)
	// The copy is in both queues now (the broker confirmed it); a-3,
	// published after it, comes behind it in each queue, so once both
	// subscribers handled a-3 they have received the copy.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := signupv1.PublishAccountOpened(ctx, tx, &signupv1.AccountOpened{AccountId: "a-3", Email: "a-3@example.com"}, message.Meta{})
		return err
	}))
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM ledger WHERE account_id = 'a-3'`) == 2
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, h.Stop(ctx))
	stopped = true

	require.Equal(t, 4, count(`SELECT count(*) FROM mails`))
	require.Equal(t, 1, count(`SELECT count(*) FROM ledger WHERE kind = 'opened' AND account_id = 'a-1'`), "a republished event is handled once per subscriber")
	for _, acct := range []string{"a-1", "a-2", "a-3", "flaky", "poison", "stubborn"} {
		require.Equal(t, 1, count(`SELECT count(*) FROM ledger WHERE kind = 'opened' AND account_id = $1`, acct), acct)
	}
	require.Equal(t, 2, count(`SELECT count(*) FROM saga_inbox WHERE message_id = $1`, ids["a-1"]), "one claim per subscribing service")
	for _, acct := range []string{"a-1", "a-2", "flaky"} {
		require.Equal(t, 1, count(`SELECT count(*) FROM ledger WHERE kind = 'welcome' AND account_id = $1 AND causation_id = $2`, acct, ids[acct]),
			"WelcomeSent of %s continues the event's conversation", acct)
	}
	require.Equal(t, 0, count(`SELECT count(*) FROM ledger WHERE kind = 'welcome' AND account_id IN ('poison', 'stubborn')`))
	require.EqualValues(t, 2, m.flaky.Load(), "the flaky account's first delivery failed and its retry succeeded")
	var reason string
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT reason, attempts FROM saga_parked WHERE message_id = $1`, ids["poison"]).Scan(&reason, &attempts))
	require.Contains(t, reason, "mailbox does not exist")
	require.Equal(t, 1, attempts, "a permanent failure is parked at once")
	require.NoError(t, pool.QueryRow(ctx, `SELECT reason, attempts FROM saga_parked WHERE message_id = $1`, ids["stubborn"]).Scan(&reason, &attempts))
	require.Contains(t, reason, "mail server unavailable")
	require.Equal(t, 4, attempts, "the declared max_attempts (4), not the host's (3)")
}
