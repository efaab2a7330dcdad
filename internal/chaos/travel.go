package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	travelapp "github.com/protosaga/saga/examples/travel/app"
	tripv1 "github.com/protosaga/saga/examples/travel/trip/v1"
)

// The travel example's inventory: flights, hotels and car stations with
// plenty of units, and one flight without a seat.
var (
	tripFlights  = []string{"AF1001", "AF1002", "LH2001", "BA3001"}
	tripHotels   = []string{"Hotel du Parc", "Grand Hotel", "Pension Adler"}
	tripStations = []string{"LYS", "CDG", "MUC"}
)

const soldOutFlight = "XX0000"

// stockTravel stocks every flight, hotel and station of the trips.
func (r *run) stockTravel(ctx context.Context) error {
	stock := func(kind, name string, n int32) error {
		if err := travelapp.Stock(ctx, r.pool, kind, name, n); err != nil {
			return fmt.Errorf("soak: %w", err)
		}
		return nil
	}
	for _, f := range tripFlights {
		if err := stock(travelapp.KindFlight, f, initialStock); err != nil {
			return err
		}
	}
	for _, h := range tripHotels {
		if err := stock(travelapp.KindHotel, h, initialStock); err != nil {
			return err
		}
	}
	for _, s := range tripStations {
		if err := stock(travelapp.KindCar, s, initialStock); err != nil {
			return err
		}
	}
	return stock(travelapp.KindFlight, soldOutFlight, 0)
}

// tripRequest builds trip i of the run: half of the trips ask for
// insurance, half depart within a day (their check-in reminder is due at
// once), the others in 30 days (it waits in PostgreSQL past the run).
func (r *run) tripRequest(i int) (*tripv1.BookTripRequest, *order) {
	r.mu.Lock()
	roll := r.rng.Float64()
	insured := r.rng.IntN(2) == 0
	soon := r.rng.IntN(2) == 0
	flight := tripFlights[r.rng.IntN(len(tripFlights))]
	hotel := tripHotels[r.rng.IntN(len(tripHotels))]
	station := tripStations[r.rng.IntN(len(tripStations))]
	r.mu.Unlock()
	id := fmt.Sprintf("%s-t%05d", r.id, i)
	req := &tripv1.BookTripRequest{
		TripId: id, TravellerId: fmt.Sprintf("tr-%d", i%89), PassportNumber: fmt.Sprintf("P%07d", i),
		Flight: flight, Hotel: hotel, Nights: int32(1 + i%7), CarStation: station, Insurance: insured,
		CardToken: "tok_visa", PriceMinorUnits: int64(50000 + i), Currency: "EUR",
		Departure: timestamppb.New(time.Now().Add(30 * 24 * time.Hour)),
	}
	if soon {
		req.Departure = timestamppb.New(time.Now().Add(6 * time.Hour))
	}
	kind := kindOK
	switch c := r.cfg; {
	case roll < c.DeclinedShare:
		kind, req.CardToken = kindDeclined, travelapp.DeclinedCard
	case roll < c.DeclinedShare+c.SoldOutShare:
		kind, req.Flight = kindSoldOut, soldOutFlight
	case roll < c.DeclinedShare+c.SoldOutShare+c.RejectedShare:
		kind, req.PassportNumber = kindRejected, travelapp.ExpiredPassportPrefix+req.GetPassportNumber()
	case roll < c.DeclinedShare+c.SoldOutShare+c.RejectedShare+c.NoPermitShare:
		kind, req.PassportNumber = kindNoPermit, travelapp.NoPermitPassportPrefix+req.GetPassportNumber()
	}
	return req, &order{saga: sagaBookTrip, id: id, kind: kind, insured: insured, remind: soon}
}

// Travel ledger effects, as "service:effect".
const (
	effValid      = "travellers:valid"
	effRejected   = "travellers:rejected"
	effPermit     = "travellers:permit_granted"
	effPermitNo   = "travellers:permit_denied"
	effBought     = "insurance:bought"
	effVoided     = "insurance:cancelled"
	effVoidedNo   = "insurance:cancelled_nothing"
	effCardAuth   = "cards:authorized"
	effCardNo     = "cards:declined"
	effCleared    = "fraud:cleared"
	effFlagged    = "fraud:flagged"
	effAuthVoided = "cards:voided"
	effAuthVoidNo = "cards:voided_nothing"
	effCharged    = "cards:captured"
	effConfirmed  = "trip:confirmed"
	effItinerary  = "itinerary:sent"
	effReminded   = "notifications:reminded"
	reservedSufx  = ":reserved"
	cancelledSufx = ":cancelled"
)

// holdServices are the services that hold a unit for a trip.
var holdServices = []string{"hotels", "cars", "flights"}

// checkTrips verifies the travel example's invariants: each trip's effects
// (travel_ledger) once and in order, compensation exactly for what was
// held, the itinerary sent exactly for booked trips and the check-in
// reminder for those departing within a day, every unit of every
// flight, hotel and station on the shelf or held by a trip that kept it.
func (r *run) checkTrips(ctx context.Context, rep *Report, orders []*order, sagas, children map[string]sagaRow) error {
	ledger := map[string][]string{}
	rows, err := r.pool.Query(ctx, `SELECT trip_id, service || ':' || effect FROM travel_ledger ORDER BY id`)
	if err != nil {
		return fmt.Errorf("check: travel ledger: %w", err)
	}
	var tripID, effect string
	if _, err := pgx.ForEachRow(rows, []any{&tripID, &effect}, func() error {
		ledger[tripID] = append(ledger[tripID], effect)
		return nil
	}); err != nil {
		return fmt.Errorf("check: travel ledger: %w", err)
	}
	for _, o := range orders {
		sg, ok := sagas[o.id]
		if !ok || o.saga != sagaBookTrip {
			continue
		}
		checkTripLedger(rep, o, sg, ledger[o.id])
		// The child Payment: started when the trip reached its charge,
		// and ended as the trip's charge did.
		effects := ledger[o.id]
		child, started := children[o.id]
		charged := slices.Contains(effects, effCardAuth) || slices.Contains(effects, effCardNo)
		switch {
		case charged && !started:
			rep.lost(sagaBookTrip, 1)
			rep.violate("trip %s charged its card without a Payment saga: %v", o.id, effects)
		case started && sg.state == "COMPLETED" && child.state != "COMPLETED":
			rep.violate("trip %s completed, its Payment %s is %s", o.id, child.id, child.state)
		case started && child.state == "COMPLETED" && !slices.Contains(effects, effCharged):
			rep.violate("Payment %s of trip %s completed without capturing: %v", child.id, o.id, effects)
		case started && child.state == "FAILED" && sg.state == "COMPLETED":
			rep.violate("trip %s completed, its Payment %s failed", o.id, child.id)
		}
	}

	// Inventory conserved: on the shelf plus held is what was stocked.
	rows, err = r.pool.Query(ctx, `SELECT i.resource, i.available,
  (SELECT count(*) FROM travel_holds h WHERE h.resource = i.resource AND h.cancelled_at IS NULL)
FROM travel_inventory i`)
	if err != nil {
		return fmt.Errorf("check: travel inventory: %w", err)
	}
	var resource string
	var available, held int64
	if _, err := pgx.ForEachRow(rows, []any{&resource, &available, &held}, func() error {
		initial := int64(initialStock)
		if resource == travelapp.KindFlight+":"+soldOutFlight {
			initial = 0
		}
		if available+held != initial {
			rep.violate("travel inventory %s: %d available + %d held != %d", resource, available, held, initial)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("check: travel inventory: %w", err)
	}
	// Only booked trips (or trips an operator decides on) keep holds and
	// policies.
	rows, err = r.pool.Query(ctx, `SELECT trip_id FROM travel_holds WHERE cancelled_at IS NULL
UNION SELECT trip_id FROM insurance_policies WHERE cancelled_at IS NULL`)
	if err != nil {
		return fmt.Errorf("check: travel holds: %w", err)
	}
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("check: travel holds: %w", err)
	}
	for _, id := range holders {
		if st := sagas[id].state; st != "COMPLETED" && st != "MANUAL_REVIEW" {
			rep.violate("trip %s keeps a hold or a policy in state %q", id, st)
		}
	}
	return nil
}

func checkTripLedger(rep *Report, o *order, sg sagaRow, effects []string) {
	kind, insured := o.kind, o.insured
	count := map[string]int{}
	pos := map[string]int{}
	for i, e := range effects {
		count[e]++
		pos[e] = i
	}
	for e, n := range count {
		if n > 1 {
			rep.double(sagaBookTrip, n-1)
			rep.violate("trip %s: %s applied %d times: %v", o.id, e, n, effects)
		}
	}
	once := func(a, b string) {
		if count[a] > 0 && count[b] > 0 {
			rep.double(sagaBookTrip, 1)
			rep.violate("trip %s: both %s and %s: %v", o.id, a, b, effects)
		}
	}
	before := func(a, b string) {
		if count[b] > 0 && (count[a] == 0 || pos[a] > pos[b]) {
			rep.violate("trip %s: %s without %s before it: %v", o.id, b, a, effects)
		}
	}
	once(effValid, effRejected)
	once(effPermit, effPermitNo)
	if count[effValid] > 0 && count[effPermit]+count[effPermitNo] == 0 {
		// The travellers service publishes the decision with its reply.
		rep.violate("trip %s: traveller valid without an entry permit decision: %v", o.id, effects)
	}
	before(effValid, effPermit)
	before(effValid, effPermitNo)
	once(effCardAuth, effCardNo)
	once(effCleared, effFlagged)
	once(effAuthVoided, effAuthVoidNo)
	once(effCharged, effAuthVoided)
	once(effVoided, effVoidedNo)
	for _, svc := range holdServices {
		once(svc+reservedSufx, svc+":unavailable")
		once(svc+cancelledSufx, svc+":cancelled_nothing")
		before(effPermit, svc+reservedSufx)
		before(svc+reservedSufx, effCharged)
		before(svc+reservedSufx, svc+cancelledSufx)
	}
	before(effPermit, effBought)
	before(effCardAuth, effCleared)
	before(effCardAuth, effFlagged)
	before(effCleared, effCharged)
	before(effCardAuth, effAuthVoided)
	before(effBought, effVoided)
	before(effCharged, effConfirmed)
	before(effConfirmed, effItinerary)
	before(effItinerary, effReminded)
	if insured {
		before(effBought, effCharged)
	} else if count[effBought] > 0 {
		rep.violate("trip %s did not ask for insurance and bought it: %v", o.id, effects)
	}
	switch sg.state {
	case "COMPLETED":
		want := []string{effValid, effPermit, "hotels" + reservedSufx, "cars" + reservedSufx, "flights" + reservedSufx}
		if insured {
			want = append(want, effBought)
		}
		want = append(want, effCardAuth, effCleared, effCharged, effConfirmed, effItinerary)
		if o.remind {
			want = append(want, effReminded)
		}
		got := slices.Clone(effects)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			rep.violate("trip %s completed with effects %v, want %v (in any order the checks above allow)", o.id, effects, want)
		}
	case "FAILED":
		for _, e := range []string{effCharged, effConfirmed, effItinerary} {
			if count[e] > 0 {
				rep.violate("trip %s failed after %s (past the pivot): %v", o.id, e, effects)
			}
		}
		// Every hold, the policy and the card authorization are given
		// back exactly when they were taken, and after the refusal of the
		// payment that failed the trip.
		declined := -1
		for _, e := range []string{effCardNo, effFlagged} {
			if count[e] > 0 {
				declined = pos[e]
			}
		}
		for _, svc := range holdServices {
			if count[svc+reservedSufx] > 0 && count[svc+cancelledSufx] == 0 {
				rep.violate("trip %s failed with its %s hold never cancelled: %v", o.id, svc, effects)
			}
			if declined >= 0 && count[svc+cancelledSufx] > 0 && pos[svc+cancelledSufx] < declined {
				rep.violate("trip %s: %s cancelled before the payment was refused: %v", o.id, svc, effects)
			}
		}
		if count[effBought] > 0 && count[effVoided] == 0 {
			rep.violate("trip %s failed with its insurance never cancelled: %v", o.id, effects)
		}
		if count[effCardAuth] > 0 && count[effAuthVoided] == 0 {
			rep.violate("trip %s failed with its card authorization never voided: %v", o.id, effects)
		}
		switch kind {
		case kindSoldOut:
			if count["flights"+reservedSufx] > 0 {
				rep.violate("trip %s holds a seat on a sold-out flight: %v", o.id, effects)
			}
		case kindRejected, kindNoPermit:
			for _, svc := range holdServices {
				if count[svc+reservedSufx] > 0 {
					rep.violate("trip %s of a traveller who may not travel holds a %s unit: %v", o.id, svc, effects)
				}
			}
		case kindOK:
			// Fails only through a timeout before the pivot.
			for _, e := range []string{effRejected, effPermitNo, effCardNo, effFlagged, "flights:unavailable"} {
				if count[e] > 0 {
					rep.violate("trip %s that should book met %s: %v", o.id, e, effects)
				}
			}
		}
	case "MANUAL_REVIEW":
		// Any prefix of the path may have happened; the checks above
		// (once, in order) hold, and an operator decides the rest.
	default:
		if count[effItinerary]+count[effReminded] > 0 {
			rep.violate("trip %s sent its itinerary and ended %s: %v", o.id, sg.state, effects)
		}
	}
}
