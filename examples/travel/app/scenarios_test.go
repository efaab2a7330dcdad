package app_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/protosaga/saga/examples/travel/app"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	"github.com/protosaga/saga/examples/travel/payment/v1/paymentv1test"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/examples/travel/trip/v1/tripv1test"
)

// TestBookTripScenarios runs the generated scenarios of Book Trip with this
// example's decider, for a trip that asks for insurance and one that does
// not (the decider skips BuyInsurance).
func TestBookTripScenarios(t *testing.T) {
	for _, insured := range []bool{true, false} {
		t.Run(map[bool]string{true: "Insured", false: "Uninsured"}[insured], func(t *testing.T) {
			tripv1test.RunBookTripScenarios(t, app.Decider{}, request("t-scenario", insured))
		})
	}
}

// TestPaymentScenarios runs the generated scenarios of the child Payment
// saga with its decider.
func TestPaymentScenarios(t *testing.T) {
	paymentv1test.RunPaymentScenarios(t, app.PaymentDecider{}, &paymentv1.ChargeTrip{
		TripId: "t-scenario", CardToken: "tok_visa", AmountMinorUnits: 128000, Currency: "EUR",
	})
}

// request is a valid booking request for trip id, departing in 30 days.
func request(id string, insured bool) *tripv1.BookTripRequest {
	return &tripv1.BookTripRequest{
		TripId: id, TravellerId: "tr-" + id, PassportNumber: "P" + id,
		Flight: "AF1234", Hotel: "Hotel du Parc", Nights: 3, CarStation: "LYS",
		Insurance: insured, CardToken: "tok_visa", PriceMinorUnits: 128000, Currency: "EUR",
		Departure: timestamppb.New(time.Now().Add(30 * 24 * time.Hour)),
	}
}
