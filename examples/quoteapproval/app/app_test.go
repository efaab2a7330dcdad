package app_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/quoteapproval/app"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/internal/audittest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
)

// waitFor bounds every wait on the host; the whole test stays far below it.
const waitFor = 30 * time.Second

// priceVersion is the price version the tests' quotes are priced at.
const priceVersion = 7

// clock is the saga engine's clock: real time plus an offset the test moves
// forward to fire step timeouts.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

type testBundle struct {
	pool   *pgxpool.Pool
	quotes *quotev1.QuoteApproval
	clock  *clock
	// The ordering service holds the SubmitOrder of quote held until
	// release is closed.
	held        string
	release     chan struct{}
	releaseOnce sync.Once
}

// setup runs the Quote Approval example on a started host, on a fresh
// schema and vhost. The ordering service holds the SubmitOrder of quote
// held (none when empty) until b.release is closed.
func setup(t *testing.T, held string) *testBundle {
	t.Helper()
	ctx := context.Background()
	b := &testBundle{pool: testenv.Postgres(t), clock: &clock{}, held: held, release: make(chan struct{})}
	h, err := host.New(ctx, host.Config{
		Service:               "quoteapproval-test",
		Pool:                  b.pool,
		AMQPURL:               testenv.AMQP(t),
		HTTPAddr:              host.HTTPOff,
		Concurrency:           2,
		Retry:                 retry.Policy{Tiers: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, MaxAttempts: 4},
		TimeoutScanInterval:   100 * time.Millisecond,
		DrainTimeout:          5 * time.Second,
		Now:                   b.clock.Now,
		ParticipantMiddleware: b.hold,
		Logger:                slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	b.quotes, err = app.Register(h)
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() {
		b.releaseHeld() // a test that failed early leaves nothing held
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		require.NoError(t, h.Stop(stopCtx))
	})
	require.NoError(t, app.SetPriceVersion(ctx, b.pool, priceVersion, "EUR", 125000))
	return b
}

// hold is the host's participant middleware: it holds the ordering
// service's SubmitOrder of quote b.held until b.release is closed.
func (b *testBundle) hold(service string, next participant.Func) participant.Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		if c, ok := cmd.(*quotev1.SubmitOrder); ok && b.held != "" && c.GetQuoteId() == b.held {
			select {
			case <-b.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return next(ctx, tx, cmd)
	}
}

// releaseHeld lets the ordering service submit the held quote's order.
func (b *testBundle) releaseHeld() { b.releaseOnce.Do(func() { close(b.release) }) }

func (b *testBundle) submit(t *testing.T, quoteID string, version int64) string {
	t.Helper()
	id, created, err := b.quotes.Start(context.Background(), &quotev1.SubmitQuote{
		QuoteId: quoteID, CustomerId: "c-" + quoteID, CustomerEmail: quoteID + "@customer.example", PriceVersion: version,
	}, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

// decide records a person's decision with app.Decide in a transaction of
// the test's own.
func (b *testBundle) decide(t *testing.T, d app.Decision) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := app.Decide(context.Background(), tx, d)
		return err
	})
}

// wait polls the saga until it is in state, with the typed read.
func (b *testBundle) wait(t *testing.T, sagaID string, state quotev1.QuoteApprovalState) *quotev1.QuoteApprovalSnapshot {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.quotes.GetByID(context.Background(), sagaID)
		require.NoError(t, err)
		if st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %s (%s): waited %s for state %s; it is in %s (last error %q, review reason %q); audit:\n%s",
				sagaID, st.BusinessKey, waitFor, state, st.State, st.LastError, st.ReviewReason, b.auditText(t, sagaID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// step is one audit row, reduced to what the saga's path is made of.
type step struct{ From, To, Trigger, Class string }

var short = audittest.Short

func (b *testBundle) audit(t *testing.T, sagaID string) []saga.AuditRecord {
	return audittest.Audit(t, b.quotes.Engine(), sagaID)
}

func (b *testBundle) path(t *testing.T, sagaID string) []step {
	var out []step
	for _, s := range audittest.Path(t, b.quotes.Engine(), sagaID) {
		out = append(out, step(s))
	}
	return out
}

func (b *testBundle) auditText(t *testing.T, sagaID string) string {
	return audittest.AuditText(t, b.quotes.Engine(), sagaID)
}

// cancelRecord waits for the audit row of the saga's CancelQuote.
func (b *testBundle) cancelRecord(t *testing.T, sagaID string) saga.AuditRecord {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		for _, r := range b.audit(t, sagaID) {
			if r.Trigger == quotev1.CancelQuoteInfo.FullName {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %s: waited %s for the cancel's audit row; audit:\n%s", sagaID, waitFor, b.auditText(t, sagaID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ledger returns the quote's business effects, oldest first, as
// "service:effect".
func (b *testBundle) ledger(t *testing.T, quoteID string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT service || ':' || effect FROM quote_ledger WHERE quote_id = $1 ORDER BY id`, quoteID)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return effects
}

// heldPrice reports whether pricing still holds a price for the quote.
func (b *testBundle) heldPrice(t *testing.T, quoteID string) bool {
	t.Helper()
	var held bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pricing_holds WHERE quote_id = $1 AND released_at IS NULL)`, quoteID).Scan(&held))
	return held
}

// orders returns the ids of the orders submitted for the quote.
func (b *testBundle) orders(t *testing.T, quoteID string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT order_id FROM ordering_orders WHERE quote_id = $1`, quoteID)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

var priced = []step{
	{"", "PRICE_QUOTE", "start", "new"},
	{"PRICE_QUOTE", "APPROVAL", "QuotePriced", "new"},
}

// TestQuoteApproval runs each way a quote can go without a clock, one quote
// per subtest, concurrently on one host.
func TestQuoteApproval(t *testing.T) {
	t.Parallel()
	b := setup(t, "q-cancel-late")
	t.Cleanup(func() { // after the subtests: no message of any quote was parked
		var parked int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_parked`).Scan(&parked))
		require.Zero(t, parked)
	})

	t.Run("ApprovedQuoteBecomesAnOrder", func(t *testing.T) {
		t.Parallel()
		id := b.submit(t, "q-approved", priceVersion)
		b.wait(t, id, quotev1.QuoteApprovalStateApproval)
		require.True(t, b.heldPrice(t, "q-approved"))
		require.NoError(t, b.decide(t, app.Decision{QuoteID: "q-approved", ApproverEmail: "ann@seller.example", Approve: true, Note: "standard terms"}))

		st := b.wait(t, id, quotev1.QuoteApprovalStateCompleted)
		require.Equal(t, slices.Concat(priced, []step{
			{"APPROVAL", "SUBMIT_ORDER", "ApprovalGranted", "new"},
			{"SUBMIT_ORDER", "COMPLETED", "OrderSubmitted", "new"},
		}), b.path(t, id))
		require.Equal(t, []string{"pricing:held", "approval:granted", "ordering:submitted"}, b.ledger(t, "q-approved"))
		require.Equal(t, []string{st.Data.GetOrderId()}, b.orders(t, "q-approved"), "one order, the one the saga names")
		require.True(t, b.heldPrice(t, "q-approved"), "an ordered quote keeps its price")
		require.Equal(t, "ann@seller.example", st.Data.GetApproverEmail())
		require.Equal(t, int64(125000), st.Data.GetPriceMinorUnits())
		require.Equal(t, "EUR", st.Data.GetCurrency())
		var minorUnits int64
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT minor_units FROM ordering_orders WHERE quote_id = 'q-approved'`).Scan(&minorUnits))
		require.Equal(t, int64(125000), minorUnits, "the order is at the held price")

		err := b.decide(t, app.Decision{QuoteID: "q-approved", ApproverEmail: "bob@seller.example", Note: "second thoughts"})
		require.ErrorIs(t, err, app.ErrAlreadyDecided)
		require.Equal(t, []string{"pricing:held", "approval:granted", "ordering:submitted"}, b.ledger(t, "q-approved"))
	})

	t.Run("RejectedQuoteReleasesItsPrice", func(t *testing.T) {
		t.Parallel()
		id := b.submit(t, "q-rejected", priceVersion)
		b.wait(t, id, quotev1.QuoteApprovalStateApproval)
		require.NoError(t, b.decide(t, app.Decision{QuoteID: "q-rejected", ApproverEmail: "ann@seller.example", Note: "margin too low"}))

		st := b.wait(t, id, quotev1.QuoteApprovalStateFailed)
		require.Equal(t, slices.Concat(priced, []step{
			{"APPROVAL", "COMPENSATING_PRICE_QUOTE", "ApprovalRejected", "new"},
			{"COMPENSATING_PRICE_QUOTE", "FAILED", "PriceReleased", "new"},
		}), b.path(t, id))
		require.Equal(t, []string{"pricing:held", "approval:rejected", "pricing:released"}, b.ledger(t, "q-rejected"))
		require.False(t, b.heldPrice(t, "q-rejected"))
		require.Empty(t, b.orders(t, "q-rejected"))
		require.Equal(t, "margin too low", st.Data.GetRejectionReason())
	})

	t.Run("UnpublishedPriceVersionFails", func(t *testing.T) {
		t.Parallel()
		id := b.submit(t, "q-no-price", 99)
		st := b.wait(t, id, quotev1.QuoteApprovalStateFailed)
		require.Equal(t, []step{
			{"", "PRICE_QUOTE", "start", "new"},
			{"PRICE_QUOTE", "FAILED", "QuotePricingFailed", "new"},
		}, b.path(t, id))
		require.Equal(t, []string{"pricing:refused"}, b.ledger(t, "q-no-price"))
		require.Equal(t, "pricing: price version 99 is not published", st.Data.GetRejectionReason())
	})

	t.Run("CancelWhileWaitingForApprovalReleasesThePrice", func(t *testing.T) {
		t.Parallel()
		id := b.submit(t, "q-withdrawn", priceVersion)
		b.wait(t, id, quotev1.QuoteApprovalStateApproval)
		_, err := b.quotes.Cancel(context.Background(), &quotev1.CancelQuote{
			QuoteId: "q-withdrawn", RequestedBy: "customer c-q-withdrawn", Reason: "found a better offer",
		}, message.Meta{})
		require.NoError(t, err)

		st := b.wait(t, id, quotev1.QuoteApprovalStateCancelled)
		require.Equal(t, slices.Concat(priced, []step{
			{"APPROVAL", "COMPENSATING_PRICE_QUOTE", "CancelQuote", "new"},
			{"COMPENSATING_PRICE_QUOTE", "CANCELLED", "PriceReleased", "new"},
		}), b.path(t, id))
		rec := b.cancelRecord(t, id)
		require.Equal(t, "customer c-q-withdrawn", rec.Operator)
		require.Contains(t, rec.Note, "found a better offer")
		require.Equal(t, []string{"pricing:held", "pricing:released"}, b.ledger(t, "q-withdrawn"))
		require.False(t, b.heldPrice(t, "q-withdrawn"))
		require.Empty(t, b.orders(t, "q-withdrawn"))
		require.Equal(t, "customer c-q-withdrawn", st.Data.GetCancelledBy())
	})

	t.Run("CancelAfterApprovalIsRefused", func(t *testing.T) {
		t.Parallel()
		id := b.submit(t, "q-cancel-late", priceVersion)
		b.wait(t, id, quotev1.QuoteApprovalStateApproval)
		require.NoError(t, b.decide(t, app.Decision{QuoteID: "q-cancel-late", ApproverEmail: "ann@seller.example", Approve: true}))
		// Ordering holds this quote's SubmitOrder: the saga waits on it.
		b.wait(t, id, quotev1.QuoteApprovalStateSubmitOrder)
		require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
			_, err := b.quotes.CancelTx(context.Background(), tx, &quotev1.CancelQuote{
				QuoteId: "q-cancel-late", RequestedBy: "customer c-q-cancel-late", Reason: "changed my mind",
			}, message.Meta{})
			return err
		}))

		rec := b.cancelRecord(t, id)
		require.Equal(t, step{"SUBMIT_ORDER", "SUBMIT_ORDER", "CancelQuote", "late"}, step{rec.From, rec.To, short(rec.Trigger), rec.Class})
		require.Equal(t, "customer c-q-cancel-late", rec.Operator)
		require.Contains(t, rec.Note, "refused")
		require.Contains(t, rec.Note, "changed my mind")
		b.releaseHeld()

		st := b.wait(t, id, quotev1.QuoteApprovalStateCompleted)
		require.Equal(t, []string{"pricing:held", "approval:granted", "ordering:submitted"}, b.ledger(t, "q-cancel-late"))
		require.Equal(t, []string{st.Data.GetOrderId()}, b.orders(t, "q-cancel-late"))
		require.True(t, b.heldPrice(t, "q-cancel-late"))
		require.Empty(t, st.Data.GetCancelledBy())
	})
}

// TestLateApprovalGoesToManualReview: nobody decides within the approval's
// 72 hours, so the held price is released and the quote fails; an approval
// that comes after that is not applied blindly: the quote goes to manual
// review (the step's late-reply policy).
func TestLateApprovalGoesToManualReview(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	id := b.submit(t, "q-late", priceVersion)
	b.wait(t, id, quotev1.QuoteApprovalStateApproval)
	b.clock.Advance(73 * time.Hour)
	b.wait(t, id, quotev1.QuoteApprovalStateFailed)
	require.False(t, b.heldPrice(t, "q-late"))

	require.NoError(t, b.decide(t, app.Decision{QuoteID: "q-late", ApproverEmail: "ann@seller.example", Approve: true}))
	st := b.wait(t, id, quotev1.QuoteApprovalStateManualReview)
	require.Equal(t, slices.Concat(priced, []step{
		{"APPROVAL", "COMPENSATING_PRICE_QUOTE", "timeout", "new"},
		{"COMPENSATING_PRICE_QUOTE", "FAILED", "PriceReleased", "new"},
		{"FAILED", "MANUAL_REVIEW", "ApprovalGranted", "late"},
	}), b.path(t, id))
	require.NotEmpty(t, st.ReviewReason)
	require.Equal(t, []string{"pricing:held", "pricing:released", "approval:granted"}, b.ledger(t, "q-late"))
	require.Empty(t, b.orders(t, "q-late"), "a late approval submits no order")
}
