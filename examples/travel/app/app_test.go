package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/protosaga/saga/examples/travel/app"
	insurancev1 "github.com/protosaga/saga/examples/travel/insurance/v1"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/internal/audittest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// waitFor bounds every wait on the host; the whole test stays far below it.
const waitFor = 30 * time.Second

type testBundle struct {
	pool     *pgxpool.Pool
	trips    *tripv1.BookTrip
	payments *paymentv1.Payment // the engine of the child sagas, for reads
}

// setup runs the travel example on a started host, on a fresh schema and
// vhost, with every flight, hotel and station of the tests stocked, and
// flight SOLD-OUT without a seat.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	b := &testBundle{pool: testenv.Postgres(t)}
	h, err := host.New(ctx, host.Config{
		Service:             "travel-test",
		Pool:                b.pool,
		AMQPURL:             testenv.AMQP(t),
		HTTPAddr:            host.HTTPOff,
		Concurrency:         2,
		Retry:               retry.Policy{Tiers: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}, MaxAttempts: 4},
		TimeoutScanInterval: 100 * time.Millisecond,
		DrainTimeout:        5 * time.Second,
		Logger:              slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	// app.Register, keeping the child saga's handle too.
	require.NoError(t, app.RegisterServices(h))
	b.payments, err = paymentv1.RegisterPayment(h, app.PaymentDecider{})
	require.NoError(t, err)
	b.trips, err = tripv1.RegisterBookTrip(h, app.Decider{})
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		require.NoError(t, h.Stop(stopCtx))
	})
	for _, s := range []struct {
		kind, name string
		n          int32
	}{
		{app.KindFlight, "AF1234", 100}, {app.KindFlight, "SOLD-OUT", 0},
		{app.KindHotel, "Hotel du Parc", 100}, {app.KindCar, "LYS", 100},
	} {
		require.NoError(t, app.Stock(ctx, b.pool, s.kind, s.name, s.n))
	}
	return b
}

func (b *testBundle) book(t *testing.T, r *tripv1.BookTripRequest) string {
	t.Helper()
	id, created, err := b.trips.Start(context.Background(), r, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

// wait polls the saga until it is in state.
func (b *testBundle) wait(t *testing.T, sagaID string, state tripv1.BookTripState) *tripv1.BookTripSnapshot {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.trips.GetByID(context.Background(), sagaID)
		require.NoError(t, err)
		if st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %s (%s): waited %s for state %s; it is in %s (last error %q, review reason %q); audit:\n%s",
				sagaID, st.BusinessKey, waitFor, state, st.State, st.LastError, st.ReviewReason,
				audittest.AuditText(t, b.trips.Engine(), sagaID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// payment returns the trip's child Payment once it is in state.
func (b *testBundle) payment(t *testing.T, tripID string, state paymentv1.PaymentState) *paymentv1.PaymentSnapshot {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.payments.Get(context.Background(), tripID)
		if err == nil && st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("payment of trip %s: waited %s for state %s: %+v, %v", tripID, waitFor, state, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ledger waits until the trip has n business effects and returns them,
// oldest first, as "service:effect".
func (b *testBundle) ledger(t *testing.T, tripID string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		rows, err := b.pool.Query(context.Background(),
			`SELECT service || ':' || effect FROM travel_ledger WHERE trip_id = $1 ORDER BY id`, tripID)
		require.NoError(t, err)
		effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		if len(effects) >= n || time.Now().After(deadline) {
			return effects
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// held returns the kinds the trip still holds.
func (b *testBundle) held(t *testing.T, tripID string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT kind FROM travel_holds WHERE trip_id = $1 AND cancelled_at IS NULL ORDER BY kind`, tripID)
	require.NoError(t, err)
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return kinds
}

type step = audittest.Step

// requireValidated checks that path starts with the traveller's
// validation and the entry permit (decision, as granted or not), in either
// order the two messages came: the travellers service publishes them in one
// transaction. The reply first: the saga waits for the permit, which
// settles the step. The permit first: it is recorded early, and the reply
// leads the saga into the step, which it settles at once. It returns how
// many entries of path the two take, and the state they lead to.
func requireValidated(t *testing.T, path []step, decision, to string) int {
	t.Helper()
	start := step{From: "", To: "VALIDATE_TRAVELLER", Trigger: "start", Class: "new"}
	want := []step{start,
		{From: "VALIDATE_TRAVELLER", To: "AWAIT_ENTRY_PERMIT", Trigger: "TravellerValid", Class: "new"},
		{From: "AWAIT_ENTRY_PERMIT", To: to, Trigger: decision, Class: "new"}}
	if len(path) > 1 && path[1].Trigger == decision {
		want = []step{start,
			{From: "VALIDATE_TRAVELLER", To: "VALIDATE_TRAVELLER", Trigger: decision, Class: "early"},
			{From: "VALIDATE_TRAVELLER", To: to, Trigger: "TravellerValid", Class: "new"}}
	}
	require.GreaterOrEqual(t, len(path), len(want), "%v", path)
	require.Equal(t, want, path[:len(want)], "%v", path)
	return len(want)
}

// requireJoined checks that path, after the validation, holds the three holds'
// replies of the ReserveTrip group in whichever order they came: the first
// two keep the saga in RESERVE_TRIP, the last moves it to next.
func requireJoined(t *testing.T, path []step, next string) {
	t.Helper()
	n := requireValidated(t, path, "EntryPermitGranted", "RESERVE_TRIP")
	require.GreaterOrEqual(t, len(path), n+3)
	var triggers []string
	for i, s := range path[n : n+3] {
		to := "RESERVE_TRIP"
		if i == 2 {
			to = next
		}
		require.Equal(t, step{From: "RESERVE_TRIP", To: to, Trigger: s.Trigger, Class: "new"}, s)
		triggers = append(triggers, s.Trigger)
	}
	require.ElementsMatch(t, []string{"FlightReserved", "HotelReserved", "CarReserved"}, triggers)
}

// requireEffects checks a trip's ledger: first, then the effects of the
// three holds in any order, then rest in order.
func requireEffects(t *testing.T, got []string, first []string, holds []string, rest ...string) {
	t.Helper()
	n := len(first)
	require.Len(t, got, n+len(holds)+len(rest), "%v", got)
	require.Equal(t, first, got[:n], "%v", got)
	require.ElementsMatch(t, holds, got[n:n+len(holds)], "%v", got)
	require.Equal(t, rest, got[n+len(holds):], "%v", got)
}

// validEffects are a valid traveller's effects: validated, and the entry
// permit granted in the same transaction.
var validEffects = []string{"travellers:valid", "travellers:permit_granted"}

var allHeld = []string{"flights:reserved", "hotels:reserved", "cars:reserved"}

// TestBookTrip runs each way a trip can go, one trip per subtest,
// concurrently on one host.
func TestBookTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t.Cleanup(func() { // after the subtests: no message of any trip was parked
		var parked int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM saga_parked`).Scan(&parked))
		require.Zero(t, parked)
	})

	t.Run("InsuredTripIsBookedAndItsItinerarySent", func(t *testing.T) {
		t.Parallel()
		r := request("t-insured", true)
		departure := time.Now().Add(6 * time.Hour).UTC().Truncate(time.Minute) // the reminder is due at once
		r.Departure = timestamppb.New(departure)
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateCompleted)
		path := audittest.Path(t, b.trips.Engine(), id)
		requireJoined(t, path, "BUY_INSURANCE")
		require.Equal(t, []step{
			{From: "BUY_INSURANCE", To: "CHARGE_TRIP", Trigger: "InsuranceBought", Class: "new"},
			{From: "CHARGE_TRIP", To: "CONFIRM_TRIP", Trigger: "TripCharged", Class: "new"},
			{From: "CONFIRM_TRIP", To: "COMPLETED", Trigger: "TripConfirmed", Class: "new"},
		}, path[len(path)-3:])
		requireEffects(t, b.ledger(t, "t-insured", 12), validEffects, allHeld,
			"insurance:bought", "cards:authorized", "fraud:cleared", "cards:captured", "trip:confirmed", "itinerary:sent", "notifications:reminded")
		require.NotEmpty(t, st.Data.GetPolicyId(), "bought through the insurer's failures")
		require.Equal(t, "permit_t-insured", st.Data.GetPermitId())
		// The charge is the child Payment's: its outcome reply carried it.
		child := b.payment(t, "t-insured", paymentv1.PaymentStateCompleted)
		require.Equal(t, child.Data.GetChargeId(), st.Data.GetChargeId())
		require.NotEmpty(t, st.Data.GetChargeId())
		require.Equal(t, []string{"car", "flight", "hotel"}, b.held(t, "t-insured"), "a booked trip keeps its holds")
		var body string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT body FROM itinerary_sent WHERE trip_id = 't-insured'`).Scan(&body))
		require.Equal(t, "flight AF1234 on "+departure.Format("2006-01-02 15:04 MST")+", hotel Hotel du Parc, car at LYS, insured", body)
	})

	t.Run("UninsuredTripSkipsInsurance", func(t *testing.T) {
		t.Parallel()
		id := b.book(t, request("t-uninsured", false))
		st := b.wait(t, id, tripv1.BookTripStateCompleted)
		requireJoined(t, audittest.Path(t, b.trips.Engine(), id), "CHARGE_TRIP")
		var skipNote string
		for _, r := range audittest.Audit(t, b.trips.Engine(), id) {
			if r.To == "CHARGE_TRIP" {
				skipNote = r.Note
			}
		}
		require.Contains(t, skipNote, "skipped conditional step BuyInsurance: travel insurance not requested")
		requireEffects(t, b.ledger(t, "t-uninsured", 10), validEffects, allHeld,
			"cards:authorized", "fraud:cleared", "cards:captured", "trip:confirmed", "itinerary:sent")
		require.Empty(t, st.Data.GetPolicyId())
		// The trip departs in 30 days: its reminder waits in PostgreSQL,
		// due the day before (the only booked trip of the test departing
		// that late).
		var due time.Time
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT deliver_at FROM saga_outbox_scheduled
WHERE message_type = $1`, tripv1.CheckInReminderInfo.FullName).Scan(&due))
		require.WithinDuration(t, st.Data.GetDeparture().AsTime().Add(-app.ReminderLead), due, time.Second)
	})

	t.Run("SoldOutFlightCancelsCarAndHotel", func(t *testing.T) {
		t.Parallel()
		r := request("t-sold-out", true)
		r.Flight = "SOLD-OUT"
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateFailed)
		// The group stops at the sold-out flight; the car and the hotel,
		// held already or still on their way, are cancelled, car first
		// (reverse contract order). A hold that comes back after the group
		// stopped is a late reply, ignored and audited: its cancellation
		// undoes it.
		path := audittest.Path(t, b.trips.Engine(), id)
		var tail []step
		for _, s := range path[requireValidated(t, path, "EntryPermitGranted", "RESERVE_TRIP"):] {
			if s.Class == "new" {
				tail = append(tail, s)
			} else {
				require.Equal(t, "late", s.Class, "%v", s)
			}
		}
		require.Equal(t, []step{
			{From: "RESERVE_TRIP", To: "COMPENSATING_RESERVE_CAR", Trigger: "FlightSoldOut", Class: "new"},
			{From: "COMPENSATING_RESERVE_CAR", To: "COMPENSATING_RESERVE_HOTEL", Trigger: "CarCancelled", Class: "new"},
			{From: "COMPENSATING_RESERVE_HOTEL", To: "FAILED", Trigger: "HotelCancelled", Class: "new"},
		}, tail[len(tail)-3:], "%v", tail)
		effects := b.ledger(t, "t-sold-out", 5)
		require.Equal(t, validEffects, effects[:2])
		require.Contains(t, effects, "flights:unavailable")
		for _, svc := range []string{"hotels", "cars"} {
			// Held then cancelled, or cancelled before the hold ran (the
			// hold then does nothing).
			held := slices.Contains(effects, svc+":reserved")
			require.Equal(t, held, slices.Contains(effects, svc+":cancelled"), "%s: %v", svc, effects)
			require.Equal(t, !held, slices.Contains(effects, svc+":cancelled_nothing"), "%s: %v", svc, effects)
		}
		require.Empty(t, b.held(t, "t-sold-out"))
		require.Equal(t, "flights: SOLD-OUT is sold out", st.Data.GetFailureReason())
	})

	t.Run("DeclinedCardCancelsEverythingInReverse", func(t *testing.T) {
		t.Parallel()
		r := request("t-declined", true)
		r.CardToken = app.DeclinedCard
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateFailed)
		// The insurance first, then the group's holds in reverse contract
		// order.
		requireEffects(t, b.ledger(t, "t-declined", 11), validEffects, allHeld,
			"insurance:bought", "cards:declined", "insurance:cancelled", "cars:cancelled", "hotels:cancelled", "flights:cancelled")
		require.Empty(t, b.held(t, "t-declined"))
		require.Equal(t, "payments: card declined", st.Data.GetFailureReason())
		child := b.payment(t, "t-declined", paymentv1.PaymentStateFailed)
		require.Equal(t, "card declined", child.Data.GetReason())
	})

	t.Run("FlaggedPaymentVoidsTheCardThenCancelsTheTrip", func(t *testing.T) {
		t.Parallel()
		r := request("t-flagged", false)
		r.CardToken = app.FlaggedCard
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateFailed)
		// The child Payment compensates its own step (the authorization)
		// before it answers PaymentDeclined; then the trip compensates.
		requireEffects(t, b.ledger(t, "t-flagged", 11), validEffects, allHeld,
			"cards:authorized", "fraud:flagged", "cards:voided", "cars:cancelled", "hotels:cancelled", "flights:cancelled")
		require.Equal(t, "payments: flagged by fraud screening", st.Data.GetFailureReason())
		child := b.payment(t, "t-flagged", paymentv1.PaymentStateFailed)
		require.Equal(t, []step{
			{From: "", To: "AUTHORIZE_CARD", Trigger: "start", Class: "new"},
			{From: "AUTHORIZE_CARD", To: "SCREEN_PAYMENT", Trigger: "CardAuthorized", Class: "new"},
			{From: "SCREEN_PAYMENT", To: "COMPENSATING_AUTHORIZE_CARD", Trigger: "PaymentFlagged", Class: "new"},
			{From: "COMPENSATING_AUTHORIZE_CARD", To: "FAILED", Trigger: "AuthorizationVoided", Class: "new"},
		}, audittest.Path(t, b.payments.Engine(), child.ID))
	})

	t.Run("EntryPermitDeniedFailsWithNothingToUndo", func(t *testing.T) {
		t.Parallel()
		r := request("t-no-permit", true)
		r.PassportNumber = app.NoPermitPassportPrefix + "123"
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateFailed)
		// An external check step: nothing before it to undo, no command
		// sent for it, no compensation.
		path := audittest.Path(t, b.trips.Engine(), id)
		require.Equal(t, 3, requireValidated(t, path, "EntryPermitDenied", "FAILED"))
		require.Len(t, path, 3, "%v", path)
		require.Equal(t, []string{"travellers:valid", "travellers:permit_denied"}, b.ledger(t, "t-no-permit", 2))
		require.Equal(t, "travellers: entry permit denied: entry refused for this passport", st.Data.GetFailureReason())
		require.Empty(t, st.Data.GetPermitId())
	})

	t.Run("ExpiredPassportFailsTheCheckWithNothingToUndo", func(t *testing.T) {
		t.Parallel()
		r := request("t-expired", false)
		r.PassportNumber = app.ExpiredPassportPrefix + "123"
		id := b.book(t, r)
		st := b.wait(t, id, tripv1.BookTripStateFailed)
		require.Equal(t, []step{
			{From: "", To: "VALIDATE_TRAVELLER", Trigger: "start", Class: "new"},
			{From: "VALIDATE_TRAVELLER", To: "FAILED", Trigger: "TravellerRejected", Class: "new"},
		}, audittest.Path(t, b.trips.Engine(), id))
		require.Equal(t, []string{"travellers:rejected"}, b.ledger(t, "t-expired", 1))
		require.Equal(t, "travellers: passport expired", st.Data.GetFailureReason())
	})
}

// TestLateReminderExpires: a check-in reminder that reaches the
// notifications service past its time_to_be_received (here: one that was
// to be received an hour ago, as after an outage of the service) is parked
// as expired, and no reminder is sent.
func TestLateReminderExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	env, err := message.New(&tripv1.CheckInReminder{TripId: "t-late", TravellerId: "tr-1", Flight: "AF1234"}, message.Meta{})
	require.NoError(t, err)
	message.SetExpiry(&env, time.Now().Add(-time.Hour))
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, env) }))
	var queue, reason string
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(ctx, `SELECT queue, reason FROM saga_parked WHERE message_id = $1`, env.MessageID).Scan(&queue, &reason)
		return err == nil
	}, waitFor, 20*time.Millisecond)
	require.Equal(t, "notifications.events.trip.v1", queue)
	require.Contains(t, reason, "expired: message "+env.MessageID)
	require.Empty(t, b.ledger(t, "t-late", 0))
}

// TestInvalidRequestStartsNoSaga: Start refuses a request without a flight.
func TestInvalidRequestStartsNoSaga(t *testing.T) {
	t.Parallel()
	_, err := app.Decider{}.Start(context.Background(), &tripv1.BookTripRequest{TripId: "t-bad"})
	require.ErrorContains(t, err, "flight is empty")
	require.ErrorContains(t, err, "nights is not positive")
}

// TestFlakyInsurerRidesItsOwnRetryTiers: the insurer fails each purchase
// InsurerFlakiness times (a transient failure, before any effect), and the
// insurance commands' own retry policy (insurance.proto) delivers it again
// until it succeeds within the BuyInsurance step's timeout, which the
// host's default policy would not. TestBookTrip's insured trips buy their
// policy through these failures.
func TestFlakyInsurerRidesItsOwnRetryTiers(t *testing.T) {
	t.Parallel()
	insurer := app.Insurance{Flaky: app.InsurerFlakiness}
	for n := 1; n <= app.InsurerFlakiness; n++ {
		env := message.Envelope{MessageID: fmt.Sprint("m", n), Headers: map[string]any{message.HeaderAttempt: int32(n)}}
		if n == 1 {
			env.Headers = nil // a first delivery carries no attempt header
		}
		ctx := participant.WithCommand(context.Background(), &env)
		_, err := insurer.BuyInsurance(ctx, nil, &insurancev1.BuyInsurance{TripId: "t-flaky"})
		require.ErrorIs(t, err, app.ErrInsurerUnavailable, "delivery %d", n)
		require.Equal(t, retry.ClassTransient, retry.ClassOf(err), "delivery %d", n)
		require.ErrorContains(t, err, "trip t-flaky")
	}

	step, ok := tripv1.BookTripDefinition().LookupStep("BuyInsurance")
	require.True(t, ok)
	// answeredAfter is how long after the first delivery the one that
	// succeeds comes under p, and whether p allows it at all.
	answeredAfter := func(p retry.Policy) (time.Duration, bool) {
		var wait time.Duration
		for n := 1; n <= app.InsurerFlakiness; n++ {
			d, ok := p.TierFor(n)
			if !ok {
				return wait, false
			}
			wait += d
		}
		return wait, true
	}
	own := insurancev1.TopologyPlan.Retry["insurance.commands"]
	wait, ok := answeredAfter(own)
	require.True(t, ok, "the insurance commands' policy %+v allows delivery %d", own, app.InsurerFlakiness+1)
	require.Less(t, wait, step.Timeout, "within the step's timeout")
	wait, ok = answeredAfter(retry.Default())
	require.False(t, ok && wait < step.Timeout, "the default policy would not do (after %s, allowed %t)", wait, ok)
}
