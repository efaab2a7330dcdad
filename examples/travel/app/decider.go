package app

import (
	"context"
	"errors"
	"fmt"

	insurancev1 "github.com/protosaga/saga/examples/travel/insurance/v1"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	reservationv1 "github.com/protosaga/saga/examples/travel/reservation/v1"
	travellerv1 "github.com/protosaga/saga/examples/travel/traveller/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/retry"
)

// Decider is the Book Trip saga's business logic: the saga data a booking
// request starts with, each command built from that data, whether the
// insurance step runs, and what the replies add to the data. Sequencing,
// timeouts, retries and compensation are the runtime's.
type Decider struct {
	tripv1.BookTripNoopFolds
}

var _ tripv1.BookTripDecider = Decider{}

// Start validates the booking request. An invalid one is a permanent
// failure: Start returns it to the caller and no saga begins.
func (Decider) Start(_ context.Context, r *tripv1.BookTripRequest) (*tripv1.BookTripData, error) {
	var errs []error
	for name, v := range map[string]string{
		"trip_id": r.GetTripId(), "traveller_id": r.GetTravellerId(), "flight": r.GetFlight(),
		"hotel": r.GetHotel(), "car_station": r.GetCarStation(), "currency": r.GetCurrency(),
	} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is empty", name))
		}
	}
	if r.GetNights() <= 0 {
		errs = append(errs, errors.New("nights is not positive"))
	}
	if r.GetPriceMinorUnits() <= 0 {
		errs = append(errs, errors.New("price_minor_units is not positive"))
	}
	if !r.GetDeparture().IsValid() {
		errs = append(errs, errors.New("departure is missing or invalid"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, retry.Permanent(fmt.Errorf("book trip %q: %w", r.GetTripId(), err))
	}
	return &tripv1.BookTripData{
		TripId:          r.GetTripId(),
		TravellerId:     r.GetTravellerId(),
		PassportNumber:  r.GetPassportNumber(),
		Flight:          r.GetFlight(),
		Hotel:           r.GetHotel(),
		Nights:          r.GetNights(),
		CarStation:      r.GetCarStation(),
		Insurance:       r.GetInsurance(),
		CardToken:       r.GetCardToken(),
		PriceMinorUnits: r.GetPriceMinorUnits(),
		Currency:        r.GetCurrency(),
		Departure:       r.GetDeparture(),
	}, nil
}

// BuildValidateTraveller asks the travellers service about the traveller.
func (Decider) BuildValidateTraveller(_ context.Context, d *tripv1.BookTripData) (*travellerv1.ValidateTraveller, error) {
	return &travellerv1.ValidateTraveller{TripId: d.GetTripId(), TravellerId: d.GetTravellerId(), PassportNumber: d.GetPassportNumber()}, nil
}

// BuildReserveHotel holds a room for the trip's nights.
func (Decider) BuildReserveHotel(_ context.Context, d *tripv1.BookTripData) (*reservationv1.ReserveHotel, error) {
	return &reservationv1.ReserveHotel{TripId: d.GetTripId(), Hotel: d.GetHotel(), Nights: d.GetNights()}, nil
}

// BuildCancelHotel gives the trip's room back.
func (Decider) BuildCancelHotel(_ context.Context, d *tripv1.BookTripData) (*reservationv1.CancelHotel, error) {
	return &reservationv1.CancelHotel{TripId: d.GetTripId()}, nil
}

// BuildReserveCar holds a car at the trip's station.
func (Decider) BuildReserveCar(_ context.Context, d *tripv1.BookTripData) (*reservationv1.ReserveCar, error) {
	return &reservationv1.ReserveCar{TripId: d.GetTripId(), Station: d.GetCarStation()}, nil
}

// BuildCancelCar gives the trip's car back.
func (Decider) BuildCancelCar(_ context.Context, d *tripv1.BookTripData) (*reservationv1.CancelCar, error) {
	return &reservationv1.CancelCar{TripId: d.GetTripId()}, nil
}

// BuildReserveFlight holds a seat on the trip's flight.
func (Decider) BuildReserveFlight(_ context.Context, d *tripv1.BookTripData) (*reservationv1.ReserveFlight, error) {
	return &reservationv1.ReserveFlight{TripId: d.GetTripId(), Flight: d.GetFlight()}, nil
}

// BuildCancelFlight gives the trip's seat back.
func (Decider) BuildCancelFlight(_ context.Context, d *tripv1.BookTripData) (*reservationv1.CancelFlight, error) {
	return &reservationv1.CancelFlight{TripId: d.GetTripId()}, nil
}

// SkipBuyInsurance skips the insurance step unless the traveller asked for
// travel insurance. The reason goes to the audit trail.
func (Decider) SkipBuyInsurance(_ context.Context, d *tripv1.BookTripData) (bool, string, error) {
	if d.GetInsurance() {
		return false, "", nil
	}
	return true, "travel insurance not requested", nil
}

// BuildBuyInsurance issues a policy for the traveller.
func (Decider) BuildBuyInsurance(_ context.Context, d *tripv1.BookTripData) (*insurancev1.BuyInsurance, error) {
	return &insurancev1.BuyInsurance{TripId: d.GetTripId(), TravellerId: d.GetTravellerId()}, nil
}

// BuildCancelInsurance voids the trip's policy.
func (Decider) BuildCancelInsurance(_ context.Context, d *tripv1.BookTripData) (*insurancev1.CancelInsurance, error) {
	return &insurancev1.CancelInsurance{TripId: d.GetTripId()}, nil
}

// BuildChargeTrip charges the trip's price.
func (Decider) BuildChargeTrip(_ context.Context, d *tripv1.BookTripData) (*paymentv1.ChargeTrip, error) {
	return &paymentv1.ChargeTrip{
		TripId: d.GetTripId(), CardToken: d.GetCardToken(), AmountMinorUnits: d.GetPriceMinorUnits(), Currency: d.GetCurrency(),
	}, nil
}

// BuildConfirmTrip confirms what the saga booked.
func (Decider) BuildConfirmTrip(_ context.Context, d *tripv1.BookTripData) (*tripv1.ConfirmTrip, error) {
	return &tripv1.ConfirmTrip{
		TripId: d.GetTripId(), TravellerId: d.GetTravellerId(), Flight: d.GetFlight(), Hotel: d.GetHotel(),
		CarStation: d.GetCarStation(), Insured: d.GetPolicyId() != "", Departure: d.GetDeparture(),
	}, nil
}

// OnTravellerRejected keeps why the traveller may not book.
func (Decider) OnTravellerRejected(_ context.Context, d *tripv1.BookTripData, m *travellerv1.TravellerRejected) error {
	d.FailureReason = "travellers: " + m.GetReason()
	return nil
}

// OnEntryPermitGranted keeps the entry permit.
func (Decider) OnEntryPermitGranted(_ context.Context, d *tripv1.BookTripData, m *travellerv1.EntryPermitGranted) error {
	d.PermitId = m.GetPermitId()
	return nil
}

// OnEntryPermitDenied keeps why the traveller may not travel.
func (Decider) OnEntryPermitDenied(_ context.Context, d *tripv1.BookTripData, m *travellerv1.EntryPermitDenied) error {
	d.FailureReason = "travellers: entry permit denied: " + m.GetReason()
	return nil
}

// OnHotelReserved keeps the room hold.
func (Decider) OnHotelReserved(_ context.Context, d *tripv1.BookTripData, m *reservationv1.HotelReserved) error {
	d.RoomHoldId = m.GetRoomHoldId()
	return nil
}

// OnHotelUnavailable keeps why the trip failed.
func (Decider) OnHotelUnavailable(_ context.Context, d *tripv1.BookTripData, m *reservationv1.HotelUnavailable) error {
	d.FailureReason = "hotels: no room left at " + m.GetHotel()
	return nil
}

// OnCarReserved keeps the car hold.
func (Decider) OnCarReserved(_ context.Context, d *tripv1.BookTripData, m *reservationv1.CarReserved) error {
	d.CarHoldId = m.GetCarHoldId()
	return nil
}

// OnCarUnavailable keeps why the trip failed.
func (Decider) OnCarUnavailable(_ context.Context, d *tripv1.BookTripData, m *reservationv1.CarUnavailable) error {
	d.FailureReason = "cars: no car left at " + m.GetStation()
	return nil
}

// OnFlightReserved keeps the seat hold.
func (Decider) OnFlightReserved(_ context.Context, d *tripv1.BookTripData, m *reservationv1.FlightReserved) error {
	d.SeatHoldId = m.GetSeatHoldId()
	return nil
}

// OnFlightSoldOut keeps why the trip failed.
func (Decider) OnFlightSoldOut(_ context.Context, d *tripv1.BookTripData, m *reservationv1.FlightSoldOut) error {
	d.FailureReason = "flights: " + m.GetFlight() + " is sold out"
	return nil
}

// OnInsuranceBought keeps the policy.
func (Decider) OnInsuranceBought(_ context.Context, d *tripv1.BookTripData, m *insurancev1.InsuranceBought) error {
	d.PolicyId = m.GetPolicyId()
	return nil
}

// OnTripCharged keeps the charge.
func (Decider) OnTripCharged(_ context.Context, d *tripv1.BookTripData, m *paymentv1.TripCharged) error {
	d.ChargeId = m.GetChargeId()
	return nil
}

// OnPaymentDeclined keeps why the trip failed.
func (Decider) OnPaymentDeclined(_ context.Context, d *tripv1.BookTripData, m *paymentv1.PaymentDeclined) error {
	d.FailureReason = "payments: " + m.GetReason()
	return nil
}
