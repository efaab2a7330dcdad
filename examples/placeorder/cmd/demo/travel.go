package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	travelapp "github.com/protosaga/saga/examples/travel/app"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
	"github.com/protosaga/saga/runtime/message"
)

// tripScenario is what a trip of the demo's travel fleet provokes.
type tripScenario struct {
	name string
	want tripv1.BookTripState
	// edit turns a plain uninsured booking into the scenario's.
	edit func(*tripv1.BookTripRequest)
}

// soldOutFlight has no seat left (stocked at 0).
const soldOutFlight = "XX0000"

var tripScenarios = []tripScenario{
	{"booked, insured", tripv1.BookTripStateCompleted, func(r *tripv1.BookTripRequest) {
		// Departs within a day: the check-in reminder is due at once.
		r.Insurance, r.Departure = true, timestamppb.New(time.Now().Add(6*time.Hour))
	}},
	{"booked, insurance skipped", tripv1.BookTripStateCompleted, nil},
	{"flight sold out", tripv1.BookTripStateFailed, func(r *tripv1.BookTripRequest) { r.Flight = soldOutFlight }},
	{"card declined", tripv1.BookTripStateFailed, func(r *tripv1.BookTripRequest) {
		r.Insurance, r.CardToken = true, travelapp.DeclinedCard
	}},
	{"payment flagged", tripv1.BookTripStateFailed, func(r *tripv1.BookTripRequest) { r.CardToken = travelapp.FlaggedCard }},
	{"entry permit denied", tripv1.BookTripStateFailed, func(r *tripv1.BookTripRequest) {
		r.PassportNumber = travelapp.NoPermitPassportPrefix + r.GetPassportNumber()
	}},
	{"passport expired", tripv1.BookTripStateFailed, func(r *tripv1.BookTripRequest) {
		r.PassportNumber = travelapp.ExpiredPassportPrefix + r.GetPassportNumber()
	}},
}

type trip struct {
	id       string
	scenario tripScenario
	sagaID   string
}

// stockTravel gives the travel fleet's flights, hotel and station plenty of
// units, and the sold-out flight none.
func (d *demo) stockTravel(ctx context.Context) error {
	for _, s := range []struct {
		kind, name string
		n          int32
	}{
		{travelapp.KindFlight, "AF1234", 1_000_000}, {travelapp.KindFlight, soldOutFlight, 0},
		{travelapp.KindHotel, "Hotel du Parc", 1_000_000}, {travelapp.KindCar, "LYS", 1_000_000},
	} {
		if err := travelapp.Stock(ctx, d.pool, s.kind, s.name, s.n); err != nil {
			return err
		}
	}
	return nil
}

// travel runs the Book Trip fleet (examples/travel) on the demo's host,
// n trips through each scenario in turn, waits for every trip to end,
// prints what happened and returns one line per trip that is lost, stuck
// or off-script.
func (d *demo) travel(ctx context.Context, n int) ([]string, error) {
	fmt.Fprintf(d.out, "\nBook Trip (examples/travel): %d trips on the same host\n", n)
	for i := range n {
		sc := tripScenarios[i%len(tripScenarios)]
		t := &trip{id: fmt.Sprintf("%s-t%03d", d.runID, i), scenario: sc}
		req := &tripv1.BookTripRequest{
			TripId: t.id, TravellerId: fmt.Sprintf("tr-%d", i%7), PassportNumber: fmt.Sprintf("P%07d", i),
			Flight: "AF1234", Hotel: "Hotel du Parc", Nights: 3, CarStation: "LYS",
			CardToken: "tok_visa", PriceMinorUnits: 128000, Currency: "EUR",
			Departure: timestamppb.New(time.Now().Add(30 * 24 * time.Hour)),
		}
		if sc.edit != nil {
			sc.edit(req)
		}
		id, _, err := d.trips.Start(ctx, req, message.Meta{})
		if err != nil {
			return nil, fmt.Errorf("start trip %s: %w", t.id, err)
		}
		t.sagaID = id
		d.tripList = append(d.tripList, t)
	}
	ids := make([]string, len(d.tripList))
	for i, t := range d.tripList {
		ids[i] = t.id
	}
	err := d.until(ctx, "the trips to end", func() (bool, error) {
		var open int
		err := d.pool.QueryRow(ctx, `SELECT count(*) FROM saga_book_trip
WHERE business_key = ANY($1) AND state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED', 'MANUAL_REVIEW')`, ids).Scan(&open)
		return open == 0, err
	})
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	// The itinerary service handles TripBooked after the saga completed,
	// and the notifications service the reminders due at once.
	itineraries, reminders := 0, 0
	wantItineraries, wantReminders := 0, 0
	for _, t := range d.tripList {
		if t.scenario.want == tripv1.BookTripStateCompleted {
			wantItineraries++
		}
		if t.scenario.name == "booked, insured" {
			wantReminders++
		}
	}
	_ = d.until(ctx, "the itineraries and reminders", func() (bool, error) {
		err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM itinerary_sent WHERE trip_id = ANY($1)),
  (SELECT count(*) FROM checkin_reminders WHERE trip_id = ANY($1))`, ids).Scan(&itineraries, &reminders)
		return itineraries >= wantItineraries && reminders >= wantReminders, err
	})

	rows, err := d.pool.Query(ctx, `SELECT business_key, state FROM saga_book_trip WHERE business_key = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read trips: %w", err)
	}
	states := map[string]tripv1.BookTripState{}
	var key string
	var state tripv1.BookTripState
	if _, err := pgx.ForEachRow(rows, []any{&key, &state}, func() error {
		states[key] = state
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read trips: %w", err)
	}
	var problems []string
	outcomes := map[string]map[tripv1.BookTripState]int{}
	example := map[string]*trip{}
	for _, t := range d.tripList {
		st, ok := states[t.id]
		if !ok {
			problems = append(problems, fmt.Sprintf("trip %s (%s): lost, no saga instance", t.id, t.scenario.name))
			continue
		}
		if outcomes[t.scenario.name] == nil {
			outcomes[t.scenario.name] = map[tripv1.BookTripState]int{}
			example[t.scenario.name] = t
		}
		outcomes[t.scenario.name][st]++
		if st != t.scenario.want {
			problems = append(problems, fmt.Sprintf("trip %s (%s): in %s, want %s", t.id, t.scenario.name, st, t.scenario.want))
		}
	}
	if itineraries != wantItineraries {
		problems = append(problems, fmt.Sprintf("%d itineraries sent for %d booked trips", itineraries, wantItineraries))
	}
	if reminders != wantReminders {
		problems = append(problems, fmt.Sprintf("%d check-in reminders sent for %d booked trips departing within a day", reminders, wantReminders))
	}
	var skipped int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM saga_audit a JOIN saga_book_trip s ON s.id = a.saga_id
WHERE s.business_key = ANY($1) AND a.note LIKE '%skipped conditional step BuyInsurance:%'`, ids).Scan(&skipped); err != nil {
		return nil, fmt.Errorf("read skips: %w", err)
	}

	wantSkipped := 0
	for _, t := range d.tripList {
		// Uninsured trips whose holds all succeed reach the insurance
		// step, and the decider skips it.
		if t.scenario.name == "booked, insurance skipped" || t.scenario.name == "payment flagged" {
			wantSkipped++
		}
	}
	if skipped != wantSkipped {
		problems = append(problems, fmt.Sprintf("insurance skipped %d times for %d uninsured trips that reached the step", skipped, wantSkipped))
	}

	tw := tabwriter.NewWriter(d.out, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  scenario\tstate: count\tone trip's effects, in order (travel_ledger)\n")
	for _, sc := range tripScenarios {
		var parts []string
		for _, s := range sortedKeys(outcomes[sc.name]) {
			parts = append(parts, fmt.Sprintf("%s: %d", s, outcomes[sc.name][s]))
		}
		effects := ""
		if t := example[sc.name]; t != nil {
			rows, err := d.pool.Query(ctx, `SELECT service || ':' || effect FROM travel_ledger WHERE trip_id = $1 ORDER BY id`, t.id)
			if err != nil {
				return nil, fmt.Errorf("read the ledger of trip %s: %w", t.id, err)
			}
			list, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return nil, fmt.Errorf("read the ledger of trip %s: %w", t.id, err)
			}
			effects = strings.Join(list, " ")
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", sc.name, strings.Join(parts, ", "), effects)
	}
	_ = tw.Flush()
	fmt.Fprintf(d.out, "  insurance skipped by the decider: %d (audited: \"skipped conditional step BuyInsurance: travel insurance not requested\")\n", skipped)
	var early int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM saga_audit a JOIN saga_book_trip s ON s.id = a.saga_id
WHERE s.business_key = ANY($1) AND a.class = 'early'`, ids).Scan(&early); err != nil {
		return nil, fmt.Errorf("read early events: %w", err)
	}
	fmt.Fprintf(d.out, "  entry permit decisions recorded early: %d (published with the traveller's validation, handled before it; each\n"+
		"    settled its step when the saga got there, none retried)\n", early)
	fmt.Fprintf(d.out, "  itineraries sent: %d (the itinerary service's subscriber of TripBooked, once per booked trip)\n", itineraries)
	var children []string
	crow, err := d.pool.Query(ctx, `SELECT state || ': ' || count(*) FROM saga_payment WHERE business_key = ANY($1) GROUP BY state ORDER BY state`, ids)
	if err != nil {
		return nil, fmt.Errorf("read the payments: %w", err)
	}
	if children, err = pgx.CollectRows(crow, pgx.RowTo[string]); err != nil {
		return nil, fmt.Errorf("read the payments: %w", err)
	}
	fmt.Fprintf(d.out, "  Payment sagas (the child each trip's ChargeTrip step starts, run by the payments service): %s\n", strings.Join(children, ", "))
	fmt.Fprintf(d.out, "  check-in reminders sent: %d (the trips departing within a day; the itinerary service schedules each for the day\n"+
		"    before the flight: the others wait in saga_outbox_scheduled, and one handled 23 h after it was due is parked as expired)\n",
		reminders)
	if t := example["card declined"]; t != nil {
		fmt.Fprintf(d.out, `  Where to look (psql "%[3]s")
    SELECT state, count(*) FROM saga_book_trip WHERE business_key LIKE '%[1]s-t%%' GROUP BY 1;
    SELECT from_state, to_state, trigger, note FROM saga_audit
      WHERE saga_id = (SELECT id FROM saga_book_trip WHERE business_key = '%[2]s') ORDER BY id;
    SELECT trip_id, service, effect, detail FROM travel_ledger WHERE trip_id = '%[2]s' ORDER BY id;
    SELECT state, review_reason FROM saga_payment WHERE business_key = '%[2]s';   -- its child Payment
    the console's saga page #/saga/%[4]s, or go run ./cmd/sagactl sagas show %[4]s
`, d.runID, t.id, d.pgURL, t.sagaID)
	}
	return problems, nil
}
