package app

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	insurancev1 "github.com/protosaga/saga/examples/travel/insurance/v1"
	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	reservationv1 "github.com/protosaga/saga/examples/travel/reservation/v1"
	travellerv1 "github.com/protosaga/saga/examples/travel/traveller/v1"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/schema"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations holds the travel services' own tables (profiles, inventory,
// holds, policies, charges, bookings, itineraries, check-in reminders and
// the travel_ledger journal).
func Migrations() schema.Source {
	sub, _ := fs.Sub(migrationsFS, "migrations") // a constant directory of the embedded tree
	return schema.Source{Name: "travel", FS: sub}
}

// RegisterServices registers the travel services on h: their tables, the
// participants and the itinerary and notifications subscribers, without
// the saga.
func RegisterServices(h *host.Host) error {
	return errors.Join(
		h.AddMigrations(Migrations()),
		travellerv1.RegisterTravellersParticipant(h, Travellers{}),
		reservationv1.RegisterFlightsParticipant(h, Flights{}),
		reservationv1.RegisterHotelsParticipant(h, Hotels{}),
		reservationv1.RegisterCarsParticipant(h, Cars{}),
		insurancev1.RegisterInsuranceParticipant(h, Insurance{Flaky: InsurerFlakiness}),
		paymentv1.RegisterCardsParticipant(h, Cards{}),
		paymentv1.RegisterFraudParticipant(h, Fraud{}),
		tripv1.RegisterTripParticipant(h, Trip{}),
		tripv1.RegisterItinerarySubscriber(h, Itinerary{}),
		tripv1.RegisterNotificationsSubscriber(h, Notifications{}),
	)
}

// Register registers the whole travel example on h: the services, the
// Payment saga (the payments service's, a child of each Book Trip) and the
// Book Trip saga. In production each service registers its own part on a
// host of its own; any number of copies of each may run.
func Register(h *host.Host) (*tripv1.BookTrip, error) {
	if err := RegisterServices(h); err != nil {
		return nil, err
	}
	if _, err := paymentv1.RegisterPayment(h, PaymentDecider{}); err != nil {
		return nil, err
	}
	return tripv1.RegisterBookTrip(h, Decider{})
}

// Stock sets how many units of a flight's seats, a hotel's rooms or a
// station's cars (kind KindFlight, KindHotel or KindCar) are available.
func Stock(ctx context.Context, pool *pgxpool.Pool, kind, name string, available int32) error {
	if _, ok := services[kind]; !ok {
		return fmt.Errorf("stock %s %s: unknown kind", kind, name)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO travel_inventory (resource, available) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET available = EXCLUDED.available`, kind+":"+name, available); err != nil {
		return fmt.Errorf("stock %s %s: %w", kind, name, err)
	}
	return nil
}
