package saga_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/metrictest"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// toShipping drives a new saga to SCHEDULE_SHIPPING.
func (b *testBundle) toShipping(t *testing.T, order string) string {
	t.Helper()
	id := b.start(t, order)
	b.mustReply(t, id, msgInventoryReserved)
	require.Equal(t, stShipping, b.mustReply(t, id, msgPaymentAuthorized).State)
	return id
}

func (b *testBundle) fire(t *testing.T) int {
	t.Helper()
	n, err := b.engine.FireTimeouts(context.Background(), 100)
	require.NoError(t, err)
	return n
}

func TestTimeoutRetriesThenManualReview(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{shippingMax: 3})
	id := b.toShipping(t, "order-1")
	first := b.status(t, id)
	require.Equal(t, 1, first.Attempt)

	require.Zero(t, b.fire(t), "nothing is due before the timeout")
	b.clock.Advance(stepTimeout - time.Microsecond)
	require.Zero(t, b.fire(t))

	b.clock.Advance(time.Microsecond)
	require.Equal(t, 1, b.fire(t))
	st := b.status(t, id)
	require.Equal(t, stShipping, st.State)
	require.Equal(t, 2, st.Attempt)
	require.NotEqual(t, first.PendingMessageID, st.PendingMessageID, "a resend is a new message")
	require.Equal(t, b.clock.Now().Add(stepTimeout), st.TimeoutAt)
	require.Zero(t, b.fire(t), "the timeout fired once")

	out := b.outbox(t, id)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ScheduleShipping"}, outboxTypes(out))
	require.Equal(t, out[2].IdempotencyKey, out[3].IdempotencyKey, "a resend keeps the idempotency key")
	require.Equal(t, st.PendingMessageID, out[3].MessageID)

	b.clock.Advance(stepTimeout)
	require.Equal(t, 1, b.fire(t))
	b.clock.Advance(stepTimeout)
	require.Equal(t, 1, b.fire(t))
	st = b.status(t, id)
	require.Equal(t, stManualReview, st.State, "the retry budget is spent")
	require.NotEmpty(t, st.ReviewReason)
	require.Len(t, b.outbox(t, id), 5)

	b.clock.Advance(10 * stepTimeout)
	require.Zero(t, b.fire(t), "manual review waits for an operator, not a clock")

	h := b.history(t, id)
	timeouts := 0
	for _, a := range h {
		if a.Trigger == sagadef.TriggerTimeout {
			timeouts++
			require.Equal(t, sagadef.ClassNew.String(), a.Class)
			require.Empty(t, a.MessageID)
		}
	}
	require.Equal(t, 3, timeouts)

	// The operator retries; the participant answers the new command.
	st, err := b.engine.Retry(context.Background(), id, st.Version, "alice", "carrier API is back")
	require.NoError(t, err)
	require.Equal(t, stShipping, st.State)
	require.Len(t, b.outbox(t, id), 6)
	st = b.mustReply(t, id, msgShippingScheduled)
	require.Equal(t, stCompleted, st.State)
}

func TestDeadlineSendsToManualReview(t *testing.T) {
	t.Parallel()
	deadline := 3 * stepTimeout
	b := setup(t, defOptions{reserveTimeout: sagadef.TimeoutRetry, reserveMax: 5, deadline: deadline})
	mp := metrictest.New(t)
	b.engine = b.newEngine(t, func(c *saga.Config) { c.Telemetry = telemetry.Providers{Meter: mp} })
	id := b.start(t, "order-1")
	require.Equal(t, baseTime.Add(deadline), b.status(t, id).DeadlineAt)
	// Nobody answers; the step timeout retries until the saga's overall
	// deadline passes.
	for b.clock.Now().Before(baseTime.Add(deadline)) {
		b.clock.Advance(stepTimeout)
		b.fire(t)
	}
	st := b.status(t, id)
	require.Equal(t, stManualReview, st.State)
	h := b.history(t, id)
	last := h[len(h)-1]
	require.Equal(t, sagadef.TriggerDeadline, last.Trigger)
	require.Equal(t, stManualReview, last.To)
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTimeouts, map[string]string{
		"saga.timeout.kind": "deadline", "saga.step": "ReserveInventory"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTransitions, map[string]string{"saga.trigger.type": "deadline"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricManualReviews, map[string]string{"saga.trigger.type": "deadline"}))
}

// TestScannersNeverDoubleFire runs several scanners against one table at
// once: every due instance gets exactly one timeout transition.
func TestScannersNeverDoubleFire(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{reserveTimeout: sagadef.TimeoutRetry, reserveMax: 5})
	const sagas, scanners = 40, 4
	ids := make([]string, sagas)
	for i := range sagas {
		ids[i] = b.start(t, fmt.Sprintf("order-%d", i))
	}
	b.clock.Advance(stepTimeout)
	buildsBefore := b.builds.Load()

	counts := make([]int, scanners)
	errs := make([]error, scanners)
	var wg sync.WaitGroup
	for s := range scanners {
		wg.Go(func() {
			for {
				n, err := b.engine.FireTimeouts(context.Background(), 3)
				if err != nil {
					errs[s] = err
					return
				}
				if n == 0 {
					return
				}
				counts[s] += n
			}
		})
	}
	wg.Wait()
	total := 0
	for s := range scanners {
		require.NoError(t, errs[s])
		total += counts[s]
	}
	require.Equal(t, sagas, total)
	require.Equal(t, int64(sagas), b.builds.Load()-buildsBefore, "no instance's timeout was even computed twice")
	for _, id := range ids {
		st := b.status(t, id)
		require.Empty(t, st.LastError)
		require.Equal(t, 2, st.Attempt, "saga %s", id)
		require.Equal(t, int64(2), st.Version)
		n := 0
		for _, a := range b.history(t, id) {
			if a.Trigger == sagadef.TriggerTimeout {
				n++
			}
		}
		require.Equal(t, 1, n, "saga %s: timeout audited once", id)
		require.Len(t, b.outbox(t, id), 2, "saga %s: one resend", id)
	}
}

// TestTimeoutRacesSuccess delivers the success reply and fires the timeout
// at the same moment for many sagas. Whichever locks the row first wins; the
// other sees the new version: a reply after the timeout is late (and, under
// apply-if-waiting, still applied to the retried step), a timeout after the
// reply finds nothing due.
func TestTimeoutRacesSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{late: sagadef.LateApplyIfWaiting, shippingMax: 5})
	const sagas = 10
	ids := make([]string, sagas)
	cmds := make([]string, sagas)
	for i := range sagas {
		ids[i] = b.toShipping(t, fmt.Sprintf("order-%d", i))
		cmds[i] = b.status(t, ids[i]).PendingMessageID
	}
	b.clock.Advance(stepTimeout)

	var wg sync.WaitGroup
	errs := make([]error, sagas+1)
	for i := range sagas {
		wg.Go(func() {
			_, errs[i] = b.reply(t, ids[i], msg(msgShippingScheduled, fmt.Sprintf("order-%d", i)), cmds[i])
		})
	}
	wg.Go(func() {
		for {
			n, err := b.engine.FireTimeouts(context.Background(), 2)
			if err != nil || n == 0 {
				errs[sagas] = err
				return
			}
		}
	})
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, id := range ids {
		st := b.status(t, id)
		require.Equal(t, stCompleted, st.State, "saga %s", id)
		var timeout, reply *string
		for _, a := range b.history(t, id) {
			switch a.Trigger {
			case sagadef.TriggerTimeout:
				timeout = &a.Class
			case msgShippingScheduled.FullName:
				reply = &a.Class
			}
		}
		require.NotNil(t, reply, "saga %s: the reply is audited", id)
		if timeout == nil {
			require.Equal(t, sagadef.ClassNew.String(), *reply, "saga %s: reply won", id)
			require.Equal(t, int64(4), st.Version)
		} else {
			require.Equal(t, sagadef.ClassLate.String(), *reply, "saga %s: timeout won, reply is late", id)
			require.Equal(t, int64(5), st.Version)
		}
	}
}

// TestScannerDefersAFailingInstance: one instance whose timeout transition
// fails (a hook error) is rolled back and deferred with its error recorded;
// the rest of the batch commits, and the scanner does not spin on it.
func TestScannerDefersAFailingInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{reserveTimeout: sagadef.TimeoutRetry, reserveMax: 3})
	good := b.start(t, "order-1")
	bad := b.start(t, "poison-1")
	b.broken.Store(true)
	b.clock.Advance(stepTimeout)

	require.Equal(t, 1, b.fire(t), "the healthy instance fires")
	require.Equal(t, 2, b.status(t, good).Attempt)
	st := b.status(t, bad)
	require.Equal(t, 1, st.Attempt, "the failed transition rolled back")
	require.Equal(t, int64(1), st.Version)
	require.Contains(t, st.LastError, "pricing service says no")
	require.Equal(t, b.clock.Now().Add(time.Minute), st.TimeoutAt, "deferred by the failure backoff")
	require.Len(t, b.outbox(t, bad), 1)
	require.Len(t, b.history(t, bad), 1, "nothing but the start is audited")
	require.Zero(t, b.fire(t), "a deferred instance is not claimed again at once")

	b.broken.Store(false)
	b.clock.Advance(time.Minute)
	require.Equal(t, 2, b.fire(t), "the deferred instance is retried with the others")
	st = b.status(t, bad)
	require.Equal(t, 2, st.Attempt)
	require.Equal(t, int64(2), st.Version)
}

// TestScannerSendsAStuckInstanceToManualReview: an instance whose due
// timeout keeps failing (its next command cannot be built) is deferred
// MaxDeferrals times, then sent to manual review with the last error,
// audited; an instance whose transition succeeds in between starts
// counting afresh.
func TestScannerSendsAStuckInstanceToManualReview(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{reserveTimeout: sagadef.TimeoutRetry, reserveMax: 5})
	mp := metrictest.New(t)
	b.engine = b.newEngine(t, func(c *saga.Config) { c.MaxDeferrals = 3; c.Telemetry = telemetry.Providers{Meter: mp} })
	stuck := b.start(t, "poison-1")
	recovers := b.start(t, "poison-2")
	deferred := func(id string) (n *int) {
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT (progress->>'deferrals')::int FROM saga_place_order WHERE id = $1`, id).Scan(&n))
		return n
	}
	b.broken.Store(true)
	b.clock.Advance(stepTimeout)
	for i := 1; i <= 3; i++ {
		require.Zero(t, b.fire(t), "deferral %d", i)
		require.Equal(t, i, *deferred(stuck))
		if i == 2 {
			// poison-2's next attempt can be built again: it moves on,
			// and its count starts over.
			b.broken.Store(false)
			_, err := b.pool.Exec(context.Background(), `UPDATE saga_place_order SET timeout_at = timeout_at + interval '1 year' WHERE id = $1`, stuck)
			require.NoError(t, err)
			b.clock.Advance(time.Minute)
			require.Equal(t, 1, b.fire(t))
			require.Nil(t, deferred(recovers), "an applied transition resets the count")
			require.Equal(t, 2, b.status(t, recovers).Attempt)
			_, err = b.pool.Exec(context.Background(), `UPDATE saga_place_order SET timeout_at = timeout_at - interval '1 year' WHERE id = $1`, stuck)
			require.NoError(t, err)
			b.broken.Store(true)
		}
		b.clock.Advance(time.Minute)
	}
	_, err := b.pool.Exec(context.Background(), `UPDATE saga_place_order SET timeout_at = NULL WHERE id = $1`, recovers)
	require.NoError(t, err)

	require.Equal(t, 1, b.fire(t), "the fourth time, the stuck instance goes to review")
	st := b.status(t, stuck)
	require.Equal(t, stManualReview, st.State)
	require.Contains(t, st.ReviewReason, "could not apply its due timeout or deadline 3 times in a row")
	require.Contains(t, st.ReviewReason, "pricing service says no")
	require.True(t, st.TimeoutAt.IsZero())
	require.True(t, st.DeadlineAt.IsZero())
	require.Nil(t, deferred(stuck))
	require.Equal(t, []string{"start:new:>" + stReserve, "stuck:new:" + stReserve + ">" + stManualReview}, trail(b.history(t, stuck)))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTransitions, map[string]string{"saga.trigger.type": "stuck", "saga.result": "applied"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricManualReviews, map[string]string{"saga.trigger.type": "stuck"}))
	require.Equal(t, 1.0, mp.Value(t, telemetry.MetricTimeouts, nil), "poison-2's retry; going to review as stuck is no fired timeout")
	b.clock.Advance(time.Hour)
	b.fire(t)
	require.Equal(t, st.Version, b.status(t, stuck).Version, "the scanner leaves it alone in review")
}

func TestRunTimeouts(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{reserveTimeout: sagadef.TimeoutRetry, reserveMax: 3})
	ids := []string{b.start(t, "order-1"), b.start(t, "order-2")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- b.engine.RunTimeouts(ctx, 5*time.Millisecond) }()
	}
	b.clock.Advance(stepTimeout)
	for _, id := range ids {
		require.Eventually(t, func() bool { return b.status(t, id).Attempt == 2 }, 10*time.Second, 5*time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	for _, id := range ids {
		n := 0
		for _, a := range b.history(t, id) {
			if a.Trigger == sagadef.TriggerTimeout {
				n++
			}
		}
		require.Equal(t, 1, n)
	}
	require.Error(t, b.engine.RunTimeouts(context.Background(), 0))
}
