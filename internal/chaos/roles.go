package chaos

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/protosaga/saga/examples/placeorder/app"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	travelapp "github.com/protosaga/saga/examples/travel/app"
	insurancev1 "github.com/protosaga/saga/examples/travel/insurance/v1"
	tpaymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	reservationv1 "github.com/protosaga/saga/examples/travel/reservation/v1"
	travellerv1 "github.com/protosaga/saga/examples/travel/traveller/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/service"
)

// Role is a part of the Place Order or the travel example that one node runs. The fleet is
// any set of nodes whose roles together cover AllRoles, and every role may
// run in several nodes at once (relays lease outbox rows with SKIP LOCKED,
// consumers share their queue, timeout scanners claim due instances with
// SKIP LOCKED).
type Role string

// The roles.
const (
	// RoleRelay runs an outbox relay.
	RoleRelay Role = "relay"
	// RoleOrchestrator runs the sagas, Place Order, Book Trip and its child
	// Payment: the consumers of their queues and their timeout scanners.
	RoleOrchestrator Role = "orchestrator"
	// RoleInventory, RolePayment, RoleShipping and RoleOrder run the
	// consumer of one Place Order participant service's command queue.
	RoleInventory Role = "inventory"
	RolePayment   Role = "payment"
	RoleShipping  Role = "shipping"
	RoleOrder     Role = "order"
	// RoleTravellers, RoleFlights, RoleHotels, RoleCars, RoleInsurance,
	// RoleCards, RoleFraud and RoleTrip run the consumer of one travel participant
	// service's command queue; RoleItinerary the itinerary service's
	// subscriber of TripBooked, RoleNotifications the notifications
	// service's subscriber of CheckInReminder.
	RoleTravellers    Role = "travellers"
	RoleFlights       Role = "flights"
	RoleHotels        Role = "hotels"
	RoleCars          Role = "cars"
	RoleInsurance     Role = "insurance"
	RoleCards         Role = "cards"
	RoleFraud         Role = "fraud"
	RoleTrip          Role = "trip"
	RoleItinerary     Role = "itinerary"
	RoleNotifications Role = "notifications"
)

// AllRoles returns every role, in a fixed order.
func AllRoles() []Role {
	return append([]Role{RoleRelay, RoleOrchestrator}, ParticipantRoles()...)
}

// ParticipantRoles returns the roles of the participant services of both
// examples and of the itinerary subscriber.
func ParticipantRoles() []Role {
	return []Role{RoleInventory, RolePayment, RoleShipping, RoleOrder,
		RoleTravellers, RoleFlights, RoleHotels, RoleCars, RoleInsurance, RoleCards, RoleFraud, RoleTrip, RoleItinerary, RoleNotifications}
}

// ParseRoles parses a comma-separated list of roles ("relay,orchestrator");
// "all" stands for AllRoles and "participants" for ParticipantRoles.
// Duplicates are dropped; an unknown name is an error.
func ParseRoles(s string) ([]Role, error) {
	var out []Role
	add := func(r Role) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for part := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(part)
		switch name {
		case "":
			continue
		case "all":
			for _, r := range AllRoles() {
				add(r)
			}
			continue
		case "participants":
			for _, r := range ParticipantRoles() {
				add(r)
			}
			continue
		}
		r := Role(name)
		if !slices.Contains(AllRoles(), r) {
			return nil, fmt.Errorf("unknown role %q (want one of %v, all or participants)", name, AllRoles())
		}
		add(r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no roles in %q", s)
	}
	return out, nil
}

// register puts the parts of the example that roles name on h, with the
// services' tables. RoleRelay is the host's Config.Relays, not a
// registration.
func register(h *host.Host, roles []Role) error {
	errs := []error{h.AddMigrations(app.Migrations()), h.AddMigrations(travelapp.Migrations())}
	for _, r := range roles {
		switch r {
		case RoleOrchestrator:
			_, err := orderv1.RegisterPlaceOrder(h, app.Decider{})
			errs = append(errs, err)
			_, err = tripv1.RegisterBookTrip(h, travelapp.Decider{})
			errs = append(errs, err)
			_, err = tpaymentv1.RegisterPayment(h, travelapp.PaymentDecider{})
			errs = append(errs, err)
		case RoleInventory:
			errs = append(errs, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
		case RolePayment:
			errs = append(errs, paymentv1.RegisterPaymentParticipant(h, app.Payment{}))
		case RoleShipping:
			errs = append(errs, shippingv1.RegisterShippingParticipant(h, app.Shipping{}))
		case RoleOrder:
			errs = append(errs, orderv1.RegisterOrderParticipant(h, app.Approval{}))
		case RoleTravellers:
			errs = append(errs, travellerv1.RegisterTravellersParticipant(h, travelapp.Travellers{}))
		case RoleFlights:
			errs = append(errs, reservationv1.RegisterFlightsParticipant(h, travelapp.Flights{}))
		case RoleHotels:
			errs = append(errs, reservationv1.RegisterHotelsParticipant(h, travelapp.Hotels{}))
		case RoleCars:
			errs = append(errs, reservationv1.RegisterCarsParticipant(h, travelapp.Cars{}))
		case RoleInsurance:
			errs = append(errs, insurancev1.RegisterInsuranceParticipant(h, travelapp.Insurance{}))
		case RoleCards:
			errs = append(errs, tpaymentv1.RegisterCardsParticipant(h, travelapp.Cards{}))
		case RoleFraud:
			errs = append(errs, tpaymentv1.RegisterFraudParticipant(h, travelapp.Fraud{}))
		case RoleTrip:
			errs = append(errs, tripv1.RegisterTripParticipant(h, travelapp.Trip{}))
		case RoleItinerary:
			errs = append(errs, tripv1.RegisterItinerarySubscriber(h, travelapp.Itinerary{}))
		case RoleNotifications:
			errs = append(errs, tripv1.RegisterNotificationsSubscriber(h, travelapp.Notifications{}))
		}
	}
	return errors.Join(errs...)
}

// Topology is the examples' merged topology with work queues of type qt and
// retry tiers for policy p: what the fleet declares.
func Topology(qt broker.QueueType, p retry.Policy) broker.Topology {
	var t broker.Topology
	for _, pkg := range []service.Package{
		inventoryv1.SagaPackage(), paymentv1.SagaPackage(), shippingv1.SagaPackage(), orderv1.SagaPackage(),
		travellerv1.SagaPackage(), reservationv1.SagaPackage(), insurancev1.SagaPackage(), tpaymentv1.SagaPackage(), tripv1.SagaPackage(),
	} {
		t = t.Merge(pkg.Topology(qt, p))
	}
	return t
}
