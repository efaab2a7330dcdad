package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	insurancev1 "github.com/protosaga/saga/examples/travel/insurance/v1"
	reservationv1 "github.com/protosaga/saga/examples/travel/reservation/v1"
	travellerv1 "github.com/protosaga/saga/examples/travel/traveller/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// ExpiredPassportPrefix starts the passport numbers the travellers service
// treats as expired.
const ExpiredPassportPrefix = "EXPIRED-"

// NoPermitPassportPrefix starts the passport numbers of travellers the
// destination refuses an entry permit.
const NoPermitPassportPrefix = "NOPERMIT-"

// journal records one business effect in travel_ledger, in the effect's
// transaction, sent with the reply in one round trip.
func journal(ctx context.Context, tx pgx.Tx, tripID, service, effect, detail string) error {
	return participant.Defer(ctx, tx, fmt.Sprintf("%s: journal %s of trip %s", service, effect, tripID),
		`INSERT INTO travel_ledger (trip_id, service, effect, detail) VALUES ($1, $2, $3, $4)`,
		tripID, service, effect, detail)
}

// Travellers is the travellers service: it says whether a traveller may
// book, and publishes the destination's entry permit decision for a valid
// one. Two check steps: nothing to undo.
type Travellers struct{}

var _ travellerv1.TravellersParticipant = Travellers{}

// ValidateTraveller refuses a blocked traveller and a missing or expired
// passport. For a valid traveller it also publishes the entry permit
// decision (EntryPermitGranted, or EntryPermitDenied for a passport starting
// with NoPermitPassportPrefix) through the outbox, in the transaction of its
// reply: both go out when the validation commits, in no promised order.
func (Travellers) ValidateTraveller(ctx context.Context, tx pgx.Tx, cmd *travellerv1.ValidateTraveller) (travellerv1.ValidateTravellerResult, error) {
	tripID := cmd.GetTripId()
	var blocked bool
	err := tx.QueryRow(ctx, `SELECT blocked FROM traveller_profiles WHERE traveller_id = $1`, cmd.GetTravellerId()).Scan(&blocked)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("travellers: read profile %s (trip %s): %w", cmd.GetTravellerId(), tripID, err)
	}
	reason := ""
	switch {
	case blocked:
		reason = "traveller " + cmd.GetTravellerId() + " is blocked"
	case cmd.GetPassportNumber() == "":
		reason = "no passport number"
	case strings.HasPrefix(cmd.GetPassportNumber(), ExpiredPassportPrefix):
		reason = "passport expired"
	}
	if reason != "" {
		if err := journal(ctx, tx, tripID, "travellers", "rejected", reason); err != nil {
			return nil, err
		}
		return &travellerv1.TravellerRejected{TripId: tripID, Reason: reason}, nil
	}
	if err := journal(ctx, tx, tripID, "travellers", "valid", ""); err != nil {
		return nil, err
	}
	if err := permit(ctx, tx, tripID, cmd.GetPassportNumber()); err != nil {
		return nil, err
	}
	return &travellerv1.TravellerValid{TripId: tripID}, nil
}

// permit publishes the destination's entry permit decision for the trip
// and journals it. The permit id derives from the trip, so a redelivered
// validation that runs again decides the same.
func permit(ctx context.Context, tx pgx.Tx, tripID, passport string) error {
	var err error
	effect, detail := "permit_granted", "permit_"+tripID
	if strings.HasPrefix(passport, NoPermitPassportPrefix) {
		effect, detail = "permit_denied", "entry refused for this passport"
		_, err = travellerv1.PublishEntryPermitDenied(ctx, tx, &travellerv1.EntryPermitDenied{TripId: tripID, Reason: detail}, message.Meta{})
	} else {
		_, err = travellerv1.PublishEntryPermitGranted(ctx, tx, &travellerv1.EntryPermitGranted{TripId: tripID, PermitId: detail}, message.Meta{})
	}
	if err != nil {
		return fmt.Errorf("travellers: publish the entry permit decision of trip %s: %w", tripID, err)
	}
	return journal(ctx, tx, tripID, "travellers", effect, detail)
}

// Inventory kinds: a flight's seats, a hotel's rooms, a station's cars.
const (
	KindFlight = "flight"
	KindHotel  = "hotel"
	KindCar    = "car"
)

// services names the service of each inventory kind in the ledger.
var services = map[string]string{KindFlight: "flights", KindHotel: "hotels", KindCar: "cars"}

// ReleaseHoldSQL is in the statement by which a cancellation gives a unit
// back: the compensation's effect (the chaos soak stops a node right after
// it, internal/chaos).
const ReleaseHoldSQL = "SET available = i.available + 1"

// hold takes one unit of resource (kind:name) for the trip, or reports that
// none is left. Each kind's effects take one advisory lock first, so that
// consumer batches holding several trips' effects never deadlock on the
// inventory rows.
func hold(ctx context.Context, tx pgx.Tx, kind, tripID, name string) (holdID string, ok bool, err error) {
	svc := services[kind]
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('travel.' || $1))`, kind); err != nil {
		return "", false, fmt.Errorf("%s: lock inventory: %w", svc, err)
	}
	resource := kind + ":" + name
	var available int32
	err = tx.QueryRow(ctx, `SELECT available FROM travel_inventory WHERE resource = $1 FOR UPDATE`, resource).Scan(&available)
	if errors.Is(err, pgx.ErrNoRows) {
		available = 0
	} else if err != nil {
		return "", false, fmt.Errorf("%s: read %s for trip %s: %w", svc, resource, tripID, err)
	}
	if available < 1 {
		return "", false, journal(ctx, tx, tripID, svc, "unavailable", resource)
	}
	holdID = kind + "_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, fmt.Sprintf("%s: take %s for trip %s", svc, resource, tripID),
		`UPDATE travel_inventory SET available = available - 1 WHERE resource = $1`, resource); err != nil {
		return "", false, err
	}
	if err := participant.Defer(ctx, tx, fmt.Sprintf("%s: record hold of trip %s", svc, tripID),
		`INSERT INTO travel_holds (trip_id, kind, resource, hold_id) VALUES ($1, $2, $3, $4)`, tripID, kind, resource, holdID); err != nil {
		return "", false, err
	}
	return holdID, true, journal(ctx, tx, tripID, svc, "reserved", resource)
}

// release gives back whatever unit of kind the trip holds. Releasing a trip
// that holds nothing succeeds: a cancellation the saga sends because the
// reservation timed out may arrive before the reservation, and the runtime
// then drops the reservation when it comes (its compensation ran).
func release(ctx context.Context, tx pgx.Tx, kind, tripID string) error {
	svc := services[kind]
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('travel.' || $1))`, kind); err != nil {
		return fmt.Errorf("%s: lock inventory: %w", svc, err)
	}
	var resource string
	err := tx.QueryRow(ctx, `UPDATE travel_holds SET cancelled_at = now()
WHERE trip_id = $1 AND kind = $2 AND cancelled_at IS NULL RETURNING resource`, tripID, kind).Scan(&resource)
	if errors.Is(err, pgx.ErrNoRows) {
		return journal(ctx, tx, tripID, svc, "cancelled_nothing", "")
	}
	if err != nil {
		return fmt.Errorf("%s: cancel the hold of trip %s: %w", svc, tripID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE travel_inventory i `+ReleaseHoldSQL+` WHERE i.resource = $1`, resource); err != nil {
		return fmt.Errorf("%s: give %s back (trip %s): %w", svc, resource, tripID, err)
	}
	return journal(ctx, tx, tripID, svc, "cancelled", resource)
}

// Flights is the flights service: it holds a seat for a trip.
type Flights struct{}

var _ reservationv1.FlightsParticipant = Flights{}

// ReserveFlight holds a seat, or answers FlightSoldOut.
func (Flights) ReserveFlight(ctx context.Context, tx pgx.Tx, cmd *reservationv1.ReserveFlight) (reservationv1.ReserveFlightResult, error) {
	id, ok, err := hold(ctx, tx, KindFlight, cmd.GetTripId(), cmd.GetFlight())
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return &reservationv1.FlightSoldOut{TripId: cmd.GetTripId(), Flight: cmd.GetFlight()}, nil
	}
	return &reservationv1.FlightReserved{TripId: cmd.GetTripId(), SeatHoldId: id}, nil
}

// CancelFlight gives the trip's seat back.
func (Flights) CancelFlight(ctx context.Context, tx pgx.Tx, cmd *reservationv1.CancelFlight) (reservationv1.CancelFlightResult, error) {
	if err := release(ctx, tx, KindFlight, cmd.GetTripId()); err != nil {
		return nil, err
	}
	return &reservationv1.FlightCancelled{TripId: cmd.GetTripId()}, nil
}

// Hotels is the hotels service: it holds a room for a trip.
type Hotels struct{}

var _ reservationv1.HotelsParticipant = Hotels{}

// ReserveHotel holds a room, or answers HotelUnavailable.
func (Hotels) ReserveHotel(ctx context.Context, tx pgx.Tx, cmd *reservationv1.ReserveHotel) (reservationv1.ReserveHotelResult, error) {
	id, ok, err := hold(ctx, tx, KindHotel, cmd.GetTripId(), cmd.GetHotel())
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return &reservationv1.HotelUnavailable{TripId: cmd.GetTripId(), Hotel: cmd.GetHotel()}, nil
	}
	return &reservationv1.HotelReserved{TripId: cmd.GetTripId(), RoomHoldId: id}, nil
}

// CancelHotel gives the trip's room back.
func (Hotels) CancelHotel(ctx context.Context, tx pgx.Tx, cmd *reservationv1.CancelHotel) (reservationv1.CancelHotelResult, error) {
	if err := release(ctx, tx, KindHotel, cmd.GetTripId()); err != nil {
		return nil, err
	}
	return &reservationv1.HotelCancelled{TripId: cmd.GetTripId()}, nil
}

// Cars is the car rental service: it holds a car for a trip.
type Cars struct{}

var _ reservationv1.CarsParticipant = Cars{}

// ReserveCar holds a car, or answers CarUnavailable.
func (Cars) ReserveCar(ctx context.Context, tx pgx.Tx, cmd *reservationv1.ReserveCar) (reservationv1.ReserveCarResult, error) {
	id, ok, err := hold(ctx, tx, KindCar, cmd.GetTripId(), cmd.GetStation())
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return &reservationv1.CarUnavailable{TripId: cmd.GetTripId(), Station: cmd.GetStation()}, nil
	}
	return &reservationv1.CarReserved{TripId: cmd.GetTripId(), CarHoldId: id}, nil
}

// CancelCar gives the trip's car back.
func (Cars) CancelCar(ctx context.Context, tx pgx.Tx, cmd *reservationv1.CancelCar) (reservationv1.CancelCarResult, error) {
	if err := release(ctx, tx, KindCar, cmd.GetTripId()); err != nil {
		return nil, err
	}
	return &reservationv1.CarCancelled{TripId: cmd.GetTripId()}, nil
}

// Insurance is the insurance service: it issues a travel insurance policy
// and voids it when the saga compensates.
type Insurance struct {
	// Flaky is how many deliveries of each BuyInsurance fail before the
	// insurer's API answers: a transient failure, which the consumer
	// retries through the insurance commands' own retry tiers
	// (insurance.proto).
	Flaky int
}

var _ insurancev1.InsuranceParticipant = Insurance{}

// InsurerFlakiness is Insurance.Flaky in the example's services
// (RegisterServices): every purchase fails four times before it succeeds,
// on its fifth delivery. Under the host's default retry policy that comes
// 2m11s after the first, past the step's timeout; the insurance commands'
// own tiers (insurance.proto) bring it 5.2s after.
const InsurerFlakiness = 4

// ErrInsurerUnavailable is the insurer's transient failure.
var ErrInsurerUnavailable = errors.New("insurer unavailable")

// BuyInsurance issues the trip's policy.
func (i Insurance) BuyInsurance(ctx context.Context, tx pgx.Tx, cmd *insurancev1.BuyInsurance) (insurancev1.BuyInsuranceResult, error) {
	tripID := cmd.GetTripId()
	if n := delivery(ctx); n <= i.Flaky {
		return nil, retry.Transient(fmt.Errorf("insurance: buy the policy of trip %s (delivery %d): %w", tripID, n, ErrInsurerUnavailable))
	}
	policy := "pol_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, "insurance: issue the policy of trip "+tripID,
		`INSERT INTO insurance_policies (trip_id, policy_id) VALUES ($1, $2)`, tripID, policy); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, tripID, "insurance", "bought", policy); err != nil {
		return nil, err
	}
	return &insurancev1.InsuranceBought{TripId: tripID, PolicyId: policy}, nil
}

// delivery returns which delivery of the command being handled this is (1
// for the first, then one more per pass through a retry tier).
func delivery(ctx context.Context) int {
	if env, ok := participant.Command(ctx); ok {
		if n, ok, err := message.HeaderInt(env.Headers, message.HeaderAttempt); ok && err == nil {
			return int(n)
		}
	}
	return 1
}

// CancelInsurance voids the trip's policy; a trip without one has nothing
// to void.
func (Insurance) CancelInsurance(ctx context.Context, tx pgx.Tx, cmd *insurancev1.CancelInsurance) (insurancev1.CancelInsuranceResult, error) {
	tripID := cmd.GetTripId()
	tag, err := tx.Exec(ctx, `UPDATE insurance_policies SET cancelled_at = now() WHERE trip_id = $1 AND cancelled_at IS NULL`, tripID)
	if err != nil {
		return nil, fmt.Errorf("insurance: void the policy of trip %s: %w", tripID, err)
	}
	effect := "cancelled"
	if tag.RowsAffected() == 0 {
		effect = "cancelled_nothing"
	}
	if err := journal(ctx, tx, tripID, "insurance", effect, ""); err != nil {
		return nil, err
	}
	return &insurancev1.InsuranceCancelled{TripId: tripID}, nil
}

// Trip is the booking service's own step: it records the booked trip and
// publishes TripBooked in the same transaction (through the outbox), so the
// event goes out exactly when the booking commits.
type Trip struct{}

var _ tripv1.TripParticipant = Trip{}

// ConfirmTrip records the booking and announces it.
func (Trip) ConfirmTrip(ctx context.Context, tx pgx.Tx, cmd *tripv1.ConfirmTrip) (tripv1.ConfirmTripResult, error) {
	tripID := cmd.GetTripId()
	if err := participant.Defer(ctx, tx, "trip: record booking of trip "+tripID,
		`INSERT INTO trip_bookings (trip_id, traveller_id) VALUES ($1, $2)`, tripID, cmd.GetTravellerId()); err != nil {
		return nil, err
	}
	if _, err := tripv1.PublishTripBooked(ctx, tx, &tripv1.TripBooked{
		TripId: tripID, TravellerId: cmd.GetTravellerId(), Flight: cmd.GetFlight(), Hotel: cmd.GetHotel(),
		CarStation: cmd.GetCarStation(), Insured: cmd.GetInsured(), Departure: cmd.GetDeparture(),
	}, message.Meta{}); err != nil {
		return nil, fmt.Errorf("trip: publish TripBooked of trip %s: %w", tripID, err)
	}
	if err := journal(ctx, tx, tripID, "trip", "confirmed", ""); err != nil {
		return nil, err
	}
	return &tripv1.TripConfirmed{TripId: tripID}, nil
}

// ReminderLead is how long before departure the check-in reminder is due.
const ReminderLead = 24 * time.Hour

// Itinerary is the itinerary service, a subscriber of TripBooked: it sends
// the traveller the itinerary and schedules the check-in reminder. The
// host's consumer dedupes each event by message id, so a redelivered
// TripBooked sends nothing twice.
type Itinerary struct{}

var _ tripv1.ItinerarySubscriber = Itinerary{}

// TripBooked writes the itinerary, records that it was sent, and schedules
// the check-in reminder for ReminderLead before departure (published at
// once when that is past), all in the event's transaction.
func (Itinerary) TripBooked(ctx context.Context, tx pgx.Tx, e *tripv1.TripBooked) error {
	tripID := e.GetTripId()
	departure := e.GetDeparture().AsTime()
	body := fmt.Sprintf("flight %s on %s, hotel %s, car at %s", e.GetFlight(), departure.UTC().Format("2006-01-02 15:04 MST"), e.GetHotel(), e.GetCarStation())
	if e.GetInsured() {
		body += ", insured"
	}
	if _, err := tripv1.ScheduleCheckInReminder(ctx, tx, &tripv1.CheckInReminder{
		TripId: tripID, TravellerId: e.GetTravellerId(), Flight: e.GetFlight(), Departure: e.GetDeparture(),
	}, message.Meta{}, departure.Add(-ReminderLead)); err != nil {
		return fmt.Errorf("itinerary: schedule the check-in reminder of trip %s: %w", tripID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO itinerary_sent (trip_id, traveller_id, body) VALUES ($1, $2, $3)`,
		tripID, e.GetTravellerId(), body); err != nil {
		return fmt.Errorf("itinerary: send the itinerary of trip %s: %w", tripID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO travel_ledger (trip_id, service, effect, detail) VALUES ($1, 'itinerary', 'sent', $2)`,
		tripID, body); err != nil {
		return fmt.Errorf("itinerary: journal the itinerary of trip %s: %w", tripID, err)
	}
	return nil
}

// Notifications is the notifications service, a subscriber of
// CheckInReminder: it reminds the traveller to check in, once per trip. A
// reminder handled too late never gets here: the consumer parks it as
// expired (the event's time_to_be_received).
type Notifications struct{}

var _ tripv1.NotificationsSubscriber = Notifications{}

// CheckInReminder records the reminder as sent.
func (Notifications) CheckInReminder(ctx context.Context, tx pgx.Tx, e *tripv1.CheckInReminder) error {
	tripID := e.GetTripId()
	if _, err := tx.Exec(ctx, `INSERT INTO checkin_reminders (trip_id, traveller_id, flight) VALUES ($1, $2, $3)`,
		tripID, e.GetTravellerId(), e.GetFlight()); err != nil {
		return fmt.Errorf("notifications: send the check-in reminder of trip %s: %w", tripID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO travel_ledger (trip_id, service, effect, detail) VALUES ($1, 'notifications', 'reminded', $2)`,
		tripID, e.GetFlight()); err != nil {
		return fmt.Errorf("notifications: journal the check-in reminder of trip %s: %w", tripID, err)
	}
	return nil
}
