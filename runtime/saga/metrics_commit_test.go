package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestTransitionMetricsCountCommittedWork: inside a consumer's handler (a
// write scope bound to the batch's wake set) transitions are counted once
// the batch commits, so a batch rolled back — and applied again, as the
// consumer's fast path does after a failure — counts them once, not twice.
// In a transaction of the caller's own they are counted at once, as before.
func TestTransitionMetricsCountCommittedWork(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	ctx := context.Background()
	mp := metrictest.New(t)
	eng := b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Meter: mp} })
	starts := func() int64 { return mp.Sum(t, telemetry.MetricTransitions) }
	// startInHandler starts a saga as a consumer's handler would, and
	// keeps or discards the handler's scope as the consumer does after
	// success or failure.
	startInHandler := func(order string, keep bool) *txq.Wakes {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		wakes := txq.NewWakes(tx)
		stx, scope := txq.WithScope(txq.New(tx, wakes, nil))
		_, created, err := eng.StartTx(ctx, stx, msg(msgPlaceOrder, order), message.Meta{MessageID: newID()})
		require.NoError(t, err)
		require.True(t, created)
		require.Zero(t, starts(), "nothing is counted before the commit")
		if !keep {
			scope.Discard(errors.New("a later handler of the batch failed"))
			return wakes
		}
		require.NoError(t, scope.Flush(ctx))
		scope.Keep()
		require.NoError(t, tx.Commit(ctx))
		return wakes
	}

	startInHandler("o-1", false) // rolled back
	require.Zero(t, starts())
	wakes := startInHandler("o-1", true) // applied again, committed
	require.Zero(t, starts(), "counted only once the consumer sends its after-commit work")
	require.NoError(t, wakes.Send(ctx, b.pool))
	require.EqualValues(t, 1, starts(), "the start that ran twice counts once")

	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := eng.StartTx(ctx, tx, msg(msgPlaceOrder, "o-2"), message.Meta{MessageID: newID()})
		return err
	}))
	require.EqualValues(t, 2, starts(), "in the caller's own transaction the start counts at once")
}

// setupMetered is setup with an engine that records metrics.
func setupMetered(t *testing.T) (*testBundle, *metrictest.Provider) {
	t.Helper()
	b := setup(t, defOptions{})
	mp := metrictest.New(t)
	b.engine = b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Meter: mp} })
	return b, mp
}

// latencies returns, per saga.step/saga.step.phase, the samples of the
// histogram metric: their count and sum in seconds.
func latencies(t *testing.T, mp *metrictest.Provider, metric string) map[string][2]float64 {
	t.Helper()
	out := map[string][2]float64{}
	for _, p := range mp.Points(t, metric) {
		step, _ := p.Attrs.Value(telemetry.KeySagaStep)
		phase, _ := p.Attrs.Value(telemetry.KeyStepPhase)
		out[step.AsString()+"/"+phase.AsString()] = [2]float64{p.Value, p.Sum}
	}
	return out
}

// TestStepRoundTrip: saga.step.round_trip is each step's round
// trip, from its command written to its reply applied, labelled by the
// reply's step: the first step (whose command the start sends) and the
// last one (whose reply sends nothing) included, a compensation's in its
// own phase, and a command resent after a timeout measured from the resend.
func TestStepRoundTrip(t *testing.T) {
	t.Parallel()
	b, mp := setupMetered(t)
	ctx := context.Background()

	// o-1 runs every step; ScheduleShipping times out once and is resent.
	id := b.start(t, "o-1")
	b.clock.Advance(1500 * time.Millisecond)
	b.mustReply(t, id, msgInventoryReserved)
	b.clock.Advance(700 * time.Millisecond)
	b.mustReply(t, id, msgPaymentAuthorized)
	b.clock.Advance(stepTimeout + time.Second)
	fired, err := b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, fired)
	b.clock.Advance(200 * time.Millisecond)
	require.Equal(t, sagadef.StateCompleted, b.mustReply(t, id, msgShippingScheduled).State)

	// o-2's payment is declined: ReserveInventory is compensated.
	id2 := b.start(t, "o-2")
	b.mustReply(t, id2, msgInventoryReserved)
	b.clock.Advance(400 * time.Millisecond)
	b.mustReply(t, id2, msgPaymentDeclined)
	b.clock.Advance(300 * time.Millisecond)
	require.Equal(t, sagadef.StateFailed, b.mustReply(t, id2, msgInventoryReleased).State)

	got := latencies(t, mp, telemetry.MetricStepRoundTrip)
	want := map[string][2]float64{
		"ReserveInventory/forward":      {2, 1.5},
		"AuthorizePayment/forward":      {2, 0.7 + 0.4},
		"ScheduleShipping/forward":      {1, 0.2},
		"ReserveInventory/compensation": {1, 0.3},
	}
	require.Len(t, got, len(want), "%v", got)
	for k, w := range want {
		require.Contains(t, got, k)
		require.Equal(t, w[0], got[k][0], "%s: samples", k)
		require.InDelta(t, w[1], got[k][1], 1e-6, "%s: seconds", k)
	}

	// saga.step.latency (reply in → next command out) is labelled by the
	// command a delivered reply made the saga send: none for the replies
	// that end a saga, none for the resend a timeout sent.
	handled := latencies(t, mp, telemetry.MetricStepLatency)
	samples := map[string]float64{}
	for k, v := range handled {
		samples[k] = v[0]
	}
	require.Equal(t, map[string]float64{
		"AuthorizePayment/forward":      2, // o-1's and o-2's InventoryReserved
		"ScheduleShipping/forward":      1, // o-1's PaymentAuthorized
		"ReserveInventory/compensation": 1, // o-2's PaymentDeclined
	}, samples)
}

// refuseCommits makes every commit that wrote an audit row fail (a
// deferred constraint trigger) while the returned switch is on.
func refuseCommits(t *testing.T, b *testBundle) func(on bool) {
	t.Helper()
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
CREATE TABLE refuse_commits (on_ boolean);
CREATE FUNCTION refuse_commits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT FROM refuse_commits) THEN RAISE EXCEPTION 'commit refused by the test'; END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_commits AFTER INSERT ON saga_audit
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commits();`)
	require.NoError(t, err)
	return func(on bool) {
		t.Helper()
		q := `DELETE FROM refuse_commits`
		if on {
			q = `INSERT INTO refuse_commits VALUES (true)`
		}
		_, err := b.pool.Exec(ctx, q)
		require.NoError(t, err)
	}
}

// TestScannerCountsCommittedTimeouts: a timeout scan whose commit fails
// counts nothing, so the scan that fires the timeout again counts it once
// (timeouts, the transition, the compensation it sends).
func TestScannerCountsCommittedTimeouts(t *testing.T) {
	t.Parallel()
	b, mp := setupMetered(t)
	refuse := refuseCommits(t, b)
	ctx := context.Background()
	id := b.start(t, "o-1")
	b.clock.Advance(stepTimeout + time.Second)

	refuse(true)
	_, err := b.engine.FireTimeouts(ctx, 0)
	require.ErrorContains(t, err, "commit refused by the test")
	require.Equal(t, sagadef.StateName("ReserveInventory"), b.status(t, id).State)
	require.Zero(t, mp.Value(t, telemetry.MetricTimeouts, nil), "a scan that did not commit counts no timeout")
	require.Zero(t, mp.Value(t, telemetry.MetricCompensations, nil))
	require.Zero(t, mp.Value(t, telemetry.MetricTransitions, map[string]string{"saga.trigger.type": "timeout"}))

	refuse(false)
	fired, err := b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, fired)
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTimeouts, map[string]string{
		"saga.step": "ReserveInventory", "saga.timeout.kind": "timeout"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricCompensations, map[string]string{"saga.step": "ReserveInventory"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTransitions, map[string]string{
		"saga.trigger.type": "timeout", "saga.result": "applied"}))
}

// TestOperatorMetrics: a conflicting reply counts as such and as an entry
// into manual review; an operator's compensate counts its transition and
// the compensation it sends, once it committed: one whose commit fails
// counts nothing.
func TestOperatorMetrics(t *testing.T) {
	t.Parallel()
	b, mp := setupMetered(t)
	refuse := refuseCommits(t, b)
	ctx := context.Background()

	st := b.toManualReview(t, "o-1") // by a conflicting reply
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTransitions, map[string]string{
		"saga.trigger.type": "message", "saga.result": "conflicting"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricManualReviews, map[string]string{"saga.trigger.type": "message"}))

	operator := map[string]string{"saga.trigger.type": "operator", "saga.result": "applied"}
	refuse(true)
	_, err := b.engine.Compensate(ctx, st.ID, st.Version, "alice", "customer cancelled")
	require.ErrorContains(t, err, "commit refused by the test")
	require.Zero(t, mp.Value(t, telemetry.MetricTransitions, operator), "an action that did not commit counts nothing")
	require.Zero(t, mp.Value(t, telemetry.MetricCompensations, nil))

	refuse(false)
	got, err := b.engine.Compensate(ctx, st.ID, st.Version, "alice", "customer cancelled")
	require.NoError(t, err)
	require.Equal(t, sagadef.CompensatingStateName("ReserveInventory"), got.State)
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTransitions, operator))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricCompensations, map[string]string{"saga.step": "ReserveInventory"}))
	require.Zero(t, mp.Value(t, telemetry.MetricManualReviews, map[string]string{"saga.trigger.type": "operator"}))
}

// TestFailedWritesEndTheSpanWithTheError: a timeout's transition (and an
// operator's action) whose writes fail ends its span with the error, not
// as a success: the writes are sent before the span ends.
func TestFailedWritesEndTheSpanWithTheError(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b.engine = b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Tracer: tp} })
	ctx := context.Background()
	timedOut := b.start(t, "o-timeout")
	operated := b.start(t, "o-operator")
	_, err := b.pool.Exec(ctx, `
CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'audit refused by the test'; END $$;
CREATE TRIGGER refuse_audit BEFORE INSERT ON saga_audit FOR EACH ROW EXECUTE FUNCTION refuse_audit();`)
	require.NoError(t, err)

	b.clock.Advance(stepTimeout + time.Second)
	_, err = b.engine.FireTimeouts(ctx, 0)
	require.NoError(t, err) // deferred: the scan itself goes on
	_, err = b.engine.Operate(ctx, saga.Operation{SagaID: operated, Trigger: sagadef.TriggerOperatorCancel, Operator: "alice", Reason: "test",
		ExpectedVersion: b.status(t, operated).Version})
	require.ErrorContains(t, err, "audit refused by the test")

	failed := map[string]bool{} // span name prefix + saga id
	for _, s := range rec.Ended() {
		if s.Status().Code == codes.Error && strings.Contains(s.Status().Description, "audit refused by the test") {
			for _, a := range s.Attributes() {
				if a.Key == telemetry.KeyConversationID {
					failed[strings.Fields(s.Name())[0]+" "+a.Value.AsString()] = true
				}
			}
		}
	}
	require.True(t, failed[telemetry.SpanTransition+" "+timedOut], "the timeout's transition span ended without its error: %v", failed)
	require.True(t, failed[telemetry.SpanOperate+" "+operated], "the operator action's span ended without its error: %v", failed)
}
