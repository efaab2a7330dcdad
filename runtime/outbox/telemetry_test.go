package outbox

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/telemetry"
)

// sentPoints sums messaging.client.sent.messages for exchange by
// error.type ("" for confirmed publishes).
func sentPoints(t *testing.T, mp *metrictest.Provider, exchange string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, p := range mp.Points(t, telemetry.MetricSent) {
		if !p.Matches(map[string]string{string(telemetry.KeyDestinationName): exchange, "messaging.system": "rabbitmq",
			string(telemetry.KeyOperationName): "publish"}) {
			continue
		}
		et, _ := p.Attrs.Value(telemetry.KeyErrorType)
		out[et.AsString()] += p.Value
	}
	return out
}

// TestRelayPublishMetrics runs the relay with a meter: a confirmed publish
// counts without error.type and records its delay since the message
// occurred and was written; a publish to an exchange that does not exist
// counts with error.type=no_exchange and no delay; a replay (Republish) of
// a message published days ago records the delay since the replay.
func TestRelayPublishMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	mp := metrictest.New(t)

	const days = 72 * time.Hour
	old := env(routedKey)
	old.OccurredAt = time.Now().Add(-days)
	lost := env(routedKey)
	lost.Exchange = "no-such-exchange"
	lost.SagaID, lost.CausationID = "saga-1", "cause-1"
	// Written now, as a message that occurred days ago: its delay runs from
	// when it occurred, not from when its row became pending.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Enqueue(ctx, tx, old, lost) }))
	var logs testenv.LogBuffer
	startRelay(t, b, RelayConfig{Telemetry: telemetry.Providers{Meter: mp}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})

	require.Eventually(t, func() bool {
		return sentPoints(t, mp, testExchange)[""] == 1 && sentPoints(t, mp, "no-such-exchange")["no_exchange"] >= 1
	}, 20*time.Second, 10*time.Millisecond, "confirmed %v, failed %v", sentPoints(t, mp, testExchange), sentPoints(t, mp, "no-such-exchange"))
	require.Zero(t, sentPoints(t, mp, "no-such-exchange")[""], "never confirmed")
	delay := func() metrictest.Point {
		t.Helper()
		var out metrictest.Point
		for _, p := range mp.Points(t, telemetry.MetricPublishDelay) {
			if p.Matches(map[string]string{string(telemetry.KeyDestinationName): testExchange}) {
				out = p
			}
		}
		return out
	}
	require.EqualValues(t, 1, delay().Value, "one delay per confirmed publish")
	require.InDelta(t, days.Seconds(), delay().Sum, 60, "since the message occurred")
	require.Zero(t, mp.Value(t, telemetry.MetricPublishDelay, map[string]string{string(telemetry.KeyDestinationName): "no-such-exchange"}))
	// The failure's log names the message's saga, correlation and cause.
	// The settle that logs it runs after the confirm's metric is counted.
	require.Eventually(t, func() bool {
		for _, rec := range logs.Records(t, "outbox relay: publish failed; will retry") {
			if rec["message_id"] == lost.MessageID {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "the failed publish is logged")
	var failed int
	for _, rec := range logs.Records(t, "outbox relay: publish failed; will retry") {
		if rec["message_id"] == lost.MessageID {
			failed++
			require.Equal(t, "saga-1", rec["saga_id"])
			require.Equal(t, "corr", rec["correlation_id"])
			require.Equal(t, "cause-1", rec["causation_id"])
		}
	}
	require.NotZero(t, failed)

	// The operator replays it once it is recorded as sent (the confirm is
	// counted before the settle commits; replayed while still pending, the
	// row would keep its first pending_since): its delay counts from the
	// replay.
	require.Eventually(t, func() bool {
		var sent bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM saga_outbox_sent s JOIN saga_outbox o USING (id) WHERE o.message_id = $1)`,
			old.MessageID).Scan(&sent))
		return sent
	}, 20*time.Second, 10*time.Millisecond, "the first publish is settled")
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, old) }))
	require.Eventually(t, func() bool { return sentPoints(t, mp, testExchange)[""] == 2 }, 20*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 2, delay().Value)
	require.Less(t, delay().Sum-days.Seconds(), 60.0, "the replay's delay runs from the replay, not from days ago")
}

// TestReplayedRowIsYoungInTheBacklog: a published row an operator replays
// is pending again, and the backlog's age counts from the replay, not from
// the row's creation days ago.
func TestReplayedRowIsYoungInTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t)
	mp := metrictest.New(t)
	_, err := RegisterGauges(mp.Meter("gauges"), b.pool)
	require.NoError(t, err)

	ids := enqueue(t, ctx, b.pool, 1, routedKey)
	// Written three days ago and published since.
	_, err = b.pool.Exec(ctx, `
WITH o AS (UPDATE saga_outbox SET created_at = now() - interval '3 days' WHERE message_id = $1 RETURNING id),
p AS (DELETE FROM saga_outbox_pending WHERE id IN (SELECT id FROM o))
INSERT INTO saga_outbox_sent (id, published_at, attempts, relay) SELECT id, now() - interval '3 days', 1, 'r' FROM o`, ids[0])
	require.NoError(t, err)
	require.Zero(t, mp.Value(t, telemetry.MetricOutboxBacklog, nil))
	require.Zero(t, mp.Value(t, telemetry.MetricOutboxOldestAge, nil))

	replay := env(routedKey)
	replay.MessageID = ids[0]
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return Republish(ctx, tx, replay) }))
	require.EqualValues(t, 1, mp.Value(t, telemetry.MetricOutboxBacklog, nil))
	age := mp.Value(t, telemetry.MetricOutboxOldestAge, nil)
	require.Less(t, age, 60.0, "pending since the replay, not since the row was written")
}
