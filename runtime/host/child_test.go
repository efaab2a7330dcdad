package host_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	bookingv1 "github.com/protosaga/saga/testdata/golden/child/booking/v1"
	paymentv1 "github.com/protosaga/saga/testdata/golden/child/payment/v1"
)

// The child-saga services of the end-to-end test. Their behaviour is
// chosen by the business key: a booking "refused-…" has its ticket
// refused (the pivot fails, so the parent compensates its completed
// child); a payment of booking "declined-…" has its card declined (the
// child fails); a payment of booking "review-…" is flagged by the fraud
// check and its card cannot be voided (the child's compensation times
// out into manual review).

// bookingDecider is the parent's decider: the payment is the booking's
// child, its id derived from the booking's.
type bookingDecider struct{}

func (bookingDecider) Start(_ context.Context, s *bookingv1.BookTrip) (*bookingv1.BookingData, error) {
	return &bookingv1.BookingData{BookingId: s.GetBookingId(), AmountCents: s.GetAmountCents(), PaymentId: "pay-" + s.GetBookingId()}, nil
}

func (bookingDecider) BuildHoldSeat(_ context.Context, d *bookingv1.BookingData) (*bookingv1.HoldSeat, error) {
	return &bookingv1.HoldSeat{BookingId: d.GetBookingId()}, nil
}

func (bookingDecider) BuildIssueTicket(_ context.Context, d *bookingv1.BookingData) (*bookingv1.IssueTicket, error) {
	return &bookingv1.IssueTicket{BookingId: d.GetBookingId()}, nil
}

func (bookingDecider) BuildReleaseSeat(_ context.Context, d *bookingv1.BookingData) (*bookingv1.ReleaseSeat, error) {
	return &bookingv1.ReleaseSeat{BookingId: d.GetBookingId()}, nil
}

func (bookingDecider) BuildCancelPayment(_ context.Context, d *bookingv1.BookingData) (*paymentv1.CancelPayment, error) {
	return &paymentv1.CancelPayment{PaymentId: d.GetPaymentId(), RequestedBy: "booking", Reason: "booking " + d.GetBookingId() + " compensates"}, nil
}

func (bookingDecider) BuildStartPayment(_ context.Context, d *bookingv1.BookingData) (*paymentv1.StartPayment, error) {
	return &paymentv1.StartPayment{PaymentId: d.GetPaymentId(), AmountCents: d.GetAmountCents()}, nil
}

func (bookingDecider) OnSeatHeld(context.Context, *bookingv1.BookingData, *bookingv1.SeatHeld) error {
	return nil
}

func (bookingDecider) OnSeatReleased(context.Context, *bookingv1.BookingData, *bookingv1.SeatReleased) error {
	return nil
}

func (bookingDecider) OnSeatUnavailable(context.Context, *bookingv1.BookingData, *bookingv1.SeatUnavailable) error {
	return nil
}

func (bookingDecider) OnTicketIssued(context.Context, *bookingv1.BookingData, *bookingv1.TicketIssued) error {
	return nil
}

func (bookingDecider) OnTicketRefused(context.Context, *bookingv1.BookingData, *bookingv1.TicketRefused) error {
	return nil
}

func (bookingDecider) OnPaymentCancelled(context.Context, *bookingv1.BookingData, *paymentv1.PaymentCancelled) error {
	return nil
}

func (bookingDecider) OnPaymentCompleted(_ context.Context, d *bookingv1.BookingData, m *paymentv1.PaymentCompleted) error {
	d.Authorization = m.GetAuthorization()
	return nil
}

func (bookingDecider) OnPaymentFailed(context.Context, *bookingv1.BookingData, *paymentv1.PaymentFailed) error {
	return nil
}

func (bookingDecider) OnPaymentInReview(context.Context, *bookingv1.BookingData, *paymentv1.PaymentInReview) error {
	return nil
}

// paymentDecider is the child's decider.
type paymentDecider struct{ paymentv1.PaymentNoopFolds }

func (paymentDecider) Start(_ context.Context, s *paymentv1.StartPayment) (*paymentv1.PaymentData, error) {
	return &paymentv1.PaymentData{PaymentId: s.GetPaymentId(), AmountCents: s.GetAmountCents()}, nil
}

func (paymentDecider) BuildAuthorizeCard(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.AuthorizeCard, error) {
	return &paymentv1.AuthorizeCard{PaymentId: d.GetPaymentId(), AmountCents: d.GetAmountCents()}, nil
}

func (paymentDecider) BuildScreenPayment(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.ScreenPayment, error) {
	return &paymentv1.ScreenPayment{PaymentId: d.GetPaymentId()}, nil
}

func (paymentDecider) BuildVoidCard(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.VoidCard, error) {
	return &paymentv1.VoidCard{PaymentId: d.GetPaymentId()}, nil
}

func (paymentDecider) OnCardAuthorized(_ context.Context, d *paymentv1.PaymentData, m *paymentv1.CardAuthorized) error {
	d.Authorization = m.GetAuthorization()
	return nil
}

// journal records what the participants did, per business key.
type journal struct {
	mu   sync.Mutex
	done map[string][]string
}

func (j *journal) add(key, what string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done == nil {
		j.done = map[string][]string{}
	}
	j.done[key] = append(j.done[key], what)
}

func (j *journal) of(key string) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.done[key]...)
}

// travel is the booking service's participants (seats, tickets).
type travel struct{ j *journal }

func (p travel) HoldSeat(_ context.Context, _ pgx.Tx, c *bookingv1.HoldSeat) (bookingv1.HoldSeatResult, error) {
	p.j.add(c.GetBookingId(), "hold seat")
	return &bookingv1.SeatHeld{BookingId: c.GetBookingId()}, nil
}

func (p travel) ReleaseSeat(_ context.Context, _ pgx.Tx, c *bookingv1.ReleaseSeat) (bookingv1.ReleaseSeatResult, error) {
	p.j.add(c.GetBookingId(), "release seat")
	return &bookingv1.SeatReleased{BookingId: c.GetBookingId()}, nil
}

func (p travel) IssueTicket(_ context.Context, _ pgx.Tx, c *bookingv1.IssueTicket) (bookingv1.IssueTicketResult, error) {
	if strings.HasPrefix(c.GetBookingId(), "refused-") {
		p.j.add(c.GetBookingId(), "refuse ticket")
		return &bookingv1.TicketRefused{BookingId: c.GetBookingId()}, nil
	}
	p.j.add(c.GetBookingId(), "issue ticket")
	return &bookingv1.TicketIssued{BookingId: c.GetBookingId()}, nil
}

// bank is the payment service's participants (cards, fraud).
type bank struct {
	j        *journal
	voids    atomic.Int32 // VoidCard deliveries of "review-" payments failed
	voidsFix atomic.Bool  // the card network voids "review-" payments again
}

func (p *bank) AuthorizeCard(_ context.Context, _ pgx.Tx, c *paymentv1.AuthorizeCard) (paymentv1.AuthorizeCardResult, error) {
	if strings.HasPrefix(c.GetPaymentId(), "pay-declined-") {
		p.j.add(c.GetPaymentId(), "decline card")
		return &paymentv1.CardDeclined{PaymentId: c.GetPaymentId()}, nil
	}
	p.j.add(c.GetPaymentId(), "authorize card")
	return &paymentv1.CardAuthorized{PaymentId: c.GetPaymentId(), Authorization: "auth-" + c.GetPaymentId()}, nil
}

func (p *bank) VoidCard(_ context.Context, _ pgx.Tx, c *paymentv1.VoidCard) (paymentv1.VoidCardResult, error) {
	if strings.HasPrefix(c.GetPaymentId(), "pay-review-") && !p.voidsFix.Load() {
		p.voids.Add(1)
		return nil, retry.Permanent(errors.New("card network refuses the void of " + c.GetPaymentId()))
	}
	p.j.add(c.GetPaymentId(), "void card")
	return &paymentv1.CardVoided{PaymentId: c.GetPaymentId()}, nil
}

func (p *bank) ScreenPayment(_ context.Context, _ pgx.Tx, c *paymentv1.ScreenPayment) (paymentv1.ScreenPaymentResult, error) {
	if strings.HasPrefix(c.GetPaymentId(), "pay-review-") {
		p.j.add(c.GetPaymentId(), "flag payment")
		return &paymentv1.PaymentFlagged{PaymentId: c.GetPaymentId()}, nil
	}
	p.j.add(c.GetPaymentId(), "clear payment")
	return &paymentv1.PaymentCleared{PaymentId: c.GetPaymentId()}, nil
}

// offsetClock is time.Now moved on by Advance.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// TestChildSagasAcrossServices runs a parent saga (booking) and its child
// (payment) in two services — two hosts, each with its own database
// schema, relay and consumers — through one RabbitMQ: every message
// between them goes parent outbox → relay → broker → child consumer, and
// back. A completed child moves the parent on; a failed child makes the
// parent compensate; the parent's compensation of a completed child makes
// the child compensate and answer cancelled; a child in manual review makes
// the parent stuck with the child named, and the operator's resolution of
// the child moves the parent on.
func TestChildSagasAcrossServices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amqpURL := testenv.AMQP(t)
	j := &journal{}
	cards := &bank{j: j}
	childClock := &offsetClock{}
	quiet := slog.New(slog.DiscardHandler)
	newHost := func(service string, now func() time.Time) *host.Host {
		h, err := host.New(ctx, host.Config{
			Service: service, Pool: testenv.Postgres(t), AMQPURL: amqpURL, HTTPAddr: host.HTTPOff,
			Retry:               retry.Policy{Tiers: []time.Duration{100 * time.Millisecond}, MaxAttempts: 2},
			TimeoutScanInterval: 100 * time.Millisecond, DrainTimeout: 5 * time.Second, Now: now, Logger: quiet,
		})
		require.NoError(t, err)
		return h
	}
	// The payment service starts first: its queue takes the start
	// commands the booking service sends.
	ph := newHost("payment", childClock.Now)
	require.NoError(t, paymentv1.RegisterCardsParticipant(ph, cards))
	require.NoError(t, paymentv1.RegisterFraudParticipant(ph, cards))
	payments, err := paymentv1.RegisterPayment(ph, paymentDecider{})
	require.NoError(t, err)
	require.NoError(t, ph.Start(ctx))
	bh := newHost("booking", time.Now)
	require.NoError(t, bookingv1.RegisterSeatsParticipant(bh, travel{j: j}))
	require.NoError(t, bookingv1.RegisterTicketsParticipant(bh, travel{j: j}))
	bookings, err := bookingv1.RegisterBooking(bh, bookingDecider{})
	require.NoError(t, err)
	require.NoError(t, bh.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		require.NoError(t, bh.Stop(stopCtx))
		require.NoError(t, ph.Stop(stopCtx))
	})

	book := func(id string) {
		t.Helper()
		_, created, err := bookings.Start(ctx, &bookingv1.BookTrip{BookingId: id, AmountCents: 4200}, message.Meta{})
		require.NoError(t, err)
		require.True(t, created)
	}
	waitBooking := func(id string, state bookingv1.BookingState) *bookingv1.BookingSnapshot {
		t.Helper()
		var s *bookingv1.BookingSnapshot
		require.Eventually(t, func() bool {
			var err error
			s, err = bookings.Get(ctx, id)
			return err == nil && s.State == state
		}, 30*time.Second, 20*time.Millisecond, "booking %s never reached %s (last: %+v)", id, state, s)
		return s
	}
	waitPayment := func(id string, state paymentv1.PaymentState) *paymentv1.PaymentSnapshot {
		t.Helper()
		var s *paymentv1.PaymentSnapshot
		require.Eventually(t, func() bool {
			var err error
			s, err = payments.Get(ctx, id)
			return err == nil && s.State == state
		}, 30*time.Second, 20*time.Millisecond, "payment %s never reached %s (last: %+v)", id, state, s)
		return s
	}
	for _, id := range []string{"ok-1", "declined-1", "refused-1", "review-1", "review-2"} {
		book(id)
	}

	// The child completes: the parent takes its outcome and moves on.
	b := waitBooking("ok-1", bookingv1.BookingStateCompleted)
	require.Equal(t, "auth-pay-ok-1", b.Data.GetAuthorization(), "the child's completed reply carries its data")
	p := waitPayment("pay-ok-1", paymentv1.PaymentStateCompleted)
	require.NotNil(t, p)
	require.Equal(t, []string{"hold seat", "issue ticket"}, j.of("ok-1"))
	require.Equal(t, []string{"authorize card", "clear payment"}, j.of("pay-ok-1"))

	// The child fails: the parent compensates what it completed.
	waitPayment("pay-declined-1", paymentv1.PaymentStateFailed)
	waitBooking("declined-1", bookingv1.BookingStateFailed)
	require.Equal(t, []string{"hold seat", "release seat"}, j.of("declined-1"))
	require.Equal(t, []string{"decline card"}, j.of("pay-declined-1"))

	// The pivot fails after the child completed: the parent's compensation
	// cancels the completed child, which compensates its own step and
	// answers cancelled; then the parent releases the seat.
	waitPayment("pay-refused-1", paymentv1.PaymentStateCancelled)
	waitBooking("refused-1", bookingv1.BookingStateFailed)
	require.Equal(t, []string{"hold seat", "refuse ticket", "release seat"}, j.of("refused-1"))
	require.Equal(t, []string{"authorize card", "clear payment", "void card"}, j.of("pay-refused-1"))

	// The child's compensation cannot run (the void is parked) and times
	// out: the child goes to manual review and tells its parent, which keeps
	// waiting and is stuck with the child named.
	waitPayment("pay-review-1", paymentv1.PaymentStateCompensatingAuthorizeCard)
	waitPayment("pay-review-2", paymentv1.PaymentStateCompensatingAuthorizeCard)
	require.Eventually(t, func() bool { return cards.voids.Load() >= 2 }, 30*time.Second, 20*time.Millisecond)
	childClock.Advance(31 * time.Second) // past the void's 30 s timeout, for the payment service only
	child := waitPayment("pay-review-1", paymentv1.PaymentStateManualReview)
	var parent saga.Status
	require.Eventually(t, func() bool {
		s, err := bookings.Get(ctx, "review-1")
		if err != nil {
			return false
		}
		parent, err = bookings.Status(ctx, s.ID)
		return err == nil && parent.Progress.ChildReview != nil
	}, 30*time.Second, 20*time.Millisecond, "the parent never recorded its child in review")
	require.Equal(t, string(bookingv1.BookingStatePay), parent.State, "the parent keeps waiting on its child")
	rule := saga.NewStuckRule(bookings.Engine().Definition(), saga.DefaultStuckGrace)
	stuck, err := bookings.Engine().List(ctx, saga.ListFilter{Stuck: &rule})
	require.NoError(t, err)
	require.Contains(t, idsOf(stuck.Items), parent.ID)
	reason := rule.Reason(parent.State, parent.Progress.ChildReview, &parent.TimeoutAt, nil, parent.UpdatedAt, time.Now())
	require.Contains(t, reason, "step Pay waits on a child in manual review: child.payment.v1.Payment "+child.ID+" (business key pay-review-1): ")

	// The operator resolves the child (the card voided by hand): the child
	// answers failed, the parent compensates and ends.
	_, err = payments.Engine().Resolve(ctx, child.ID, child.Version, sagadef.StateFailed, "alice", "card voided by phone with the network")
	require.NoError(t, err)
	waitBooking("review-1", bookingv1.BookingStateFailed)
	require.Equal(t, []string{"hold seat", "release seat"}, j.of("review-1"))
	after, err := bookings.Status(ctx, parent.ID)
	require.NoError(t, err)
	require.Nil(t, after.Progress.ChildReview, "the step settled, the record is gone")
	stuck, err = bookings.Engine().List(ctx, saga.ListFilter{Stuck: &rule})
	require.NoError(t, err)
	require.NotContains(t, idsOf(stuck.Items), parent.ID)

	// The parent is compensated while its child is in manual review: the
	// child records the parent's cancel for its operator, changing no
	// state; the operator's compensation of the child then ends it
	// CANCELLED, which answers the parent's cancel, and the parent
	// finishes its compensation.
	child = waitPayment("pay-review-2", paymentv1.PaymentStateManualReview)
	b = waitBooking("review-2", bookingv1.BookingStatePay)
	require.Eventually(t, func() bool {
		st, err := bookings.Status(ctx, b.ID)
		return err == nil && st.Progress.ChildReview != nil
	}, 30*time.Second, 20*time.Millisecond)
	b = waitBooking("review-2", bookingv1.BookingStatePay)
	_, err = bookings.Engine().Compensate(ctx, b.ID, b.Version, "bob", "the traveller gave up")
	require.NoError(t, err)
	var childSt saga.Status
	require.Eventually(t, func() bool {
		childSt, err = payments.Status(ctx, child.ID)
		return err == nil && childSt.Progress.Cancel != nil
	}, 30*time.Second, 20*time.Millisecond, "the child never recorded its parent's cancel")
	require.Equal(t, string(paymentv1.PaymentStateManualReview), childSt.State, "the cancel changes no state in review")
	require.Equal(t, "booking", childSt.Progress.Cancel.RequestedBy)
	require.Equal(t, "booking review-2 compensates", childSt.Progress.Cancel.Reason)
	waitBooking("review-2", bookingv1.BookingStateCompensatingPay) // waits on the child's answer to its cancel
	cards.voidsFix.Store(true)
	_, err = payments.Engine().Compensate(ctx, child.ID, childSt.Version, "alice", "the card network is back")
	require.NoError(t, err)
	waitPayment("pay-review-2", paymentv1.PaymentStateCancelled)
	waitBooking("review-2", bookingv1.BookingStateFailed)
	require.Equal(t, []string{"hold seat", "release seat"}, j.of("review-2"))
	require.Equal(t, []string{"authorize card", "flag payment", "void card"}, j.of("pay-review-2"))
}

// idsOf returns the ids of statuses.
func idsOf(items []saga.Status) []string {
	ids := make([]string, len(items))
	for i, s := range items {
		ids[i] = s.ID
	}
	return ids
}
