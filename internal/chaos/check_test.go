package chaos

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The invariant checks must be able to fail: each broken history below is
// reported, each sound one is not.
func TestLedgerCheckCatchesBrokenHistories(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		kind    string
		state   string
		effects []string
		broken  bool
	}{
		{"completed", kindOK, "COMPLETED", []string{effReserved, effAuthorized, effBooked, effApproved}, false},
		{"declined and released", kindDeclined, "FAILED", []string{effReserved, effDeclined, effReleased}, false},
		{"sold out", kindSoldOut, "FAILED", []string{effRefused}, false},
		{"timed out before the reservation", kindOK, "FAILED", []string{effReleasedNo, effRefused}, false},
		{"in review after authorizing", kindOK, "MANUAL_REVIEW", []string{effReserved, effAuthorized}, false},
		{"authorized twice", kindOK, "COMPLETED", []string{effReserved, effAuthorized, effAuthorized, effBooked, effApproved}, true},
		{"completed without approval", kindOK, "COMPLETED", []string{effReserved, effAuthorized, effBooked}, true},
		{"completed and released", kindOK, "COMPLETED", []string{effReserved, effAuthorized, effBooked, effApproved, effReleased}, true},
		{"failed, reservation kept", kindDeclined, "FAILED", []string{effReserved, effDeclined}, true},
		{"failed past the pivot", kindOK, "FAILED", []string{effReserved, effAuthorized, effReleased}, true},
		{"released before reserving", kindOK, "FAILED", []string{effReleased, effReserved}, true},
		{"booked before authorizing", kindOK, "MANUAL_REVIEW", []string{effReserved, effBooked, effAuthorized}, true},
		{"reserved and refused", kindOK, "MANUAL_REVIEW", []string{effReserved, effRefused}, true},
		{"released twice", kindDeclined, "FAILED", []string{effReserved, effDeclined, effReleased, effReleased}, true},
		{"refused with stock, no release", kindOK, "FAILED", []string{effRefused}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := &Report{}
			checkLedger(rep, &order{id: "o", kind: c.kind}, sagaRow{id: "s", key: "o", state: c.state}, c.effects)
			if c.broken {
				require.NotEmpty(t, rep.Violations)
			} else {
				require.Empty(t, rep.Violations)
			}
		})
	}
}

func TestAuditChainCheckCatchesGaps(t *testing.T) {
	t.Parallel()
	start := auditRow{from: "", to: "RESERVE_INVENTORY", trigger: "start", class: "new", version: 1}
	reserved := auditRow{from: "RESERVE_INVENTORY", to: "AUTHORIZE_PAYMENT", trigger: "r", class: "new", version: 2}
	dup := auditRow{from: "AUTHORIZE_PAYMENT", to: "AUTHORIZE_PAYMENT", trigger: "r", class: "duplicate", version: 2}
	authorized := auditRow{from: "AUTHORIZE_PAYMENT", to: "SCHEDULE_SHIPPING", trigger: "a", class: "new", version: 3}
	sg := sagaRow{id: "s", state: "SCHEDULE_SHIPPING", version: 3}
	for _, c := range []struct {
		name   string
		trail  []auditRow
		broken bool
	}{
		{"sound", []auditRow{start, reserved, dup, authorized}, false},
		{"no rows", nil, true},
		{"missing start", []auditRow{reserved, authorized}, true},
		{"unaudited transition", []auditRow{start, authorized}, true},
		{"ends elsewhere", []auditRow{start, reserved}, true},
		{"broken link", []auditRow{start, {from: "SCHEDULE_SHIPPING", to: "AUTHORIZE_PAYMENT", version: 2}, authorized}, true},
		{"change without a version", []auditRow{start, reserved, {from: "AUTHORIZE_PAYMENT", to: "FAILED", version: 2}, authorized}, true},
	} {
		rep := &Report{}
		checkAuditChain(rep, sg, c.trail)
		require.Equal(t, c.broken, len(rep.Violations) > 0, "%s: %v", c.name, rep.Violations)
	}
}

// The travel example's checks must be able to fail too.
func TestTripLedgerCheckCatchesBrokenHistories(t *testing.T) {
	t.Parallel()
	const (
		hotel, car, flight = "hotels:reserved", "cars:reserved", "flights:reserved"
		hotelX, carX, fliX = "hotels:cancelled", "cars:cancelled", "flights:cancelled"
	)
	paid := []string{effCardAuth, effCleared, effCharged}
	booked := slices.Concat([]string{effValid, effPermit, hotel, car, flight}, paid, []string{effConfirmed, effItinerary})
	for _, c := range []struct {
		name    string
		kind    string
		state   string
		effects []string
		broken  bool
	}{
		{"booked", kindOK, "COMPLETED", booked, false},
		{"booked, insured", kindOK + "+insured", "COMPLETED", slices.Concat([]string{effValid, effPermit, hotel, car, flight, effBought}, paid, []string{effConfirmed, effItinerary}), false},
		{"booked, reminded", kindOK + "+remind", "COMPLETED", append(slices.Clone(booked), effReminded), false},
		{"departs within a day, not reminded", kindOK + "+remind", "COMPLETED", booked, true},
		{"departs in a month, reminded", kindOK, "COMPLETED", append(slices.Clone(booked), effReminded), true},
		{"reminded twice", kindOK + "+remind", "COMPLETED", append(slices.Clone(booked), effReminded, effReminded), true},
		{"sold-out flight cancels car and hotel", kindSoldOut, "FAILED", []string{effValid, effPermit, hotel, car, "flights:unavailable", carX, hotelX}, false},
		{"sold-out flight, car cancelled before its hold", kindSoldOut, "FAILED", []string{effValid, effPermit, "flights:unavailable", hotel, "cars:cancelled_nothing", hotelX}, false},
		{"declined cancels everything", kindDeclined + "+insured", "FAILED", []string{effValid, effPermit, flight, car, hotel, effBought, effCardNo, effVoided, carX, hotelX, fliX}, false},
		{"flagged voids the card, then cancels everything", kindDeclined, "FAILED", []string{effValid, effPermit, flight, car, hotel, effCardAuth, effFlagged, effAuthVoided, carX, hotelX, fliX}, false},
		{"flagged, card never voided", kindDeclined, "FAILED", []string{effValid, effPermit, flight, car, hotel, effCardAuth, effFlagged, carX, hotelX, fliX}, true},
		{"captured and voided", kindOK, "MANUAL_REVIEW", []string{effValid, effPermit, flight, car, hotel, effCardAuth, effCleared, effCharged, effAuthVoided}, true},
		{"captured without screening", kindOK, "MANUAL_REVIEW", []string{effValid, effPermit, flight, car, hotel, effCardAuth, effCharged}, true},
		{"rejected traveller", kindRejected, "FAILED", []string{effRejected}, false},
		{"entry permit denied", kindNoPermit, "FAILED", []string{effValid, effPermitNo}, false},
		{"entry permit denied, then reserved", kindNoPermit, "FAILED", []string{effValid, effPermitNo, hotel, hotelX}, true},
		{"reserved without an entry permit", kindOK, "MANUAL_REVIEW", []string{effValid, hotel}, true},
		{"permit granted and denied", kindOK, "MANUAL_REVIEW", []string{effValid, effPermit, effPermitNo}, true},
		{"valid without a permit decision", kindOK, "FAILED", []string{effValid}, true},
		{"hotel timed out, cancelled first", kindOK, "FAILED", []string{effValid, effPermit, "hotels:cancelled_nothing"}, false},
		{"in review after the charge", kindOK, "MANUAL_REVIEW", slices.Concat([]string{effValid, effPermit, hotel, car, flight}, paid), false},
		{"charged twice", kindOK, "COMPLETED", slices.Concat([]string{effValid, effPermit, hotel, car, flight}, paid, []string{effCharged, effConfirmed, effItinerary}), true},
		{"itinerary sent twice", kindOK, "COMPLETED", append(slices.Clone(booked), effItinerary), true},
		{"booked without itinerary", kindOK, "COMPLETED", booked[:len(booked)-1], true},
		{"insured without asking", kindOK, "COMPLETED", slices.Concat([]string{effValid, effPermit, hotel, car, flight, effBought}, paid, []string{effConfirmed, effItinerary}), true},
		{"asked for insurance, booked without it", kindOK + "+insured", "COMPLETED", booked, true},
		{"failed, car kept", kindSoldOut, "FAILED", []string{effValid, effPermit, hotel, car, "flights:unavailable", hotelX}, true},
		{"failed, policy kept", kindDeclined + "+insured", "FAILED", []string{effValid, effPermit, hotel, car, flight, effBought, effCardNo, fliX, carX, hotelX}, true},
		{"cancelled before the decline", kindDeclined, "FAILED", []string{effValid, effPermit, hotel, car, flight, hotelX, effCardNo, fliX, carX}, true},
		{"failed past the pivot", kindOK, "FAILED", slices.Concat([]string{effValid, effPermit, hotel, car, flight}, paid, []string{fliX, carX, hotelX}), true},
		{"reserved before validation", kindOK, "MANUAL_REVIEW", []string{hotel, effValid}, true},
		{"rejected and reserved", kindRejected, "FAILED", []string{effRejected, hotel, hotelX}, true},
		{"seat on the sold-out flight", kindSoldOut, "FAILED", []string{effValid, effPermit, hotel, car, flight, effCardNo, fliX, carX, hotelX}, true},
		{"cancelled twice", kindSoldOut, "FAILED", []string{effValid, effPermit, hotel, "cars:unavailable", hotelX, hotelX}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := &Report{}
			kind, remind := strings.CutSuffix(c.kind, "+remind")
			kind, insured := strings.CutSuffix(kind, "+insured")
			o := &order{saga: sagaBookTrip, id: "t", kind: kind, insured: insured, remind: remind}
			checkTripLedger(rep, o, sagaRow{typ: sagaBookTrip, id: "s", key: "t", state: c.state}, c.effects)
			if c.broken {
				require.NotEmpty(t, rep.Violations)
			} else {
				require.Empty(t, rep.Violations)
			}
		})
	}
}
