package app_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/protosaga/saga/examples/travel/app"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/internal/audittest"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
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

var validated = []step{
	{From: "", To: "VALIDATE_TRAVELLER", Trigger: "start", Class: "new"},
	{From: "VALIDATE_TRAVELLER", To: "RESERVE_TRIP", Trigger: "TravellerValid", Class: "new"},
}

// requireJoined checks that path, from index 2, holds the three holds'
// replies of the ReserveTrip group in whichever order they came: the first
// two keep the saga in RESERVE_TRIP, the last moves it to next.
func requireJoined(t *testing.T, path []step, next string) {
	t.Helper()
	require.GreaterOrEqual(t, len(path), len(validated)+3)
	require.Equal(t, validated, path[:len(validated)])
	var triggers []string
	for i, s := range path[len(validated) : len(validated)+3] {
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
func requireEffects(t *testing.T, got []string, first string, holds []string, rest ...string) {
	t.Helper()
	require.Len(t, got, 1+len(holds)+len(rest), "%v", got)
	require.Equal(t, first, got[0], "%v", got)
	require.ElementsMatch(t, holds, got[1:1+len(holds)], "%v", got)
	require.Equal(t, rest, got[1+len(holds):], "%v", got)
}

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
		}, path[len(validated)+3:])
		requireEffects(t, b.ledger(t, "t-insured", 11), "travellers:valid", allHeld,
			"insurance:bought", "cards:authorized", "fraud:cleared", "cards:captured", "trip:confirmed", "itinerary:sent", "notifications:reminded")
		require.NotEmpty(t, st.Data.GetPolicyId())
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
		requireEffects(t, b.ledger(t, "t-uninsured", 9), "travellers:valid", allHeld,
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
		var applied []step
		for _, s := range audittest.Path(t, b.trips.Engine(), id) {
			if s.Class == "new" {
				applied = append(applied, s)
			} else {
				require.Equal(t, "late", s.Class, "%v", s)
			}
		}
		require.Equal(t, validated, applied[:len(validated)])
		tail := applied[len(validated):]
		require.Equal(t, []step{
			{From: "RESERVE_TRIP", To: "COMPENSATING_RESERVE_CAR", Trigger: "FlightSoldOut", Class: "new"},
			{From: "COMPENSATING_RESERVE_CAR", To: "COMPENSATING_RESERVE_HOTEL", Trigger: "CarCancelled", Class: "new"},
			{From: "COMPENSATING_RESERVE_HOTEL", To: "FAILED", Trigger: "HotelCancelled", Class: "new"},
		}, tail[len(tail)-3:], "%v", tail)
		effects := b.ledger(t, "t-sold-out", 4)
		require.Equal(t, "travellers:valid", effects[0])
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
		requireEffects(t, b.ledger(t, "t-declined", 10), "travellers:valid", allHeld,
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
		requireEffects(t, b.ledger(t, "t-flagged", 10), "travellers:valid", allHeld,
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
