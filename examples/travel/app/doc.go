// Package app is the travel example's business code: what a team writes
// around the generated packages traveller/v1, reservation/v1,
// insurance/v1, payment/v1 and trip/v1, and nothing else.
//
//   - Decider: the Book Trip saga's business decisions: saga data from the
//     booking request, each command built from it, whether travel insurance
//     is bought (SkipBuyInsurance: only when the traveller asked for it),
//     and what the replies add to the data.
//   - PaymentDecider: the Payment saga's, the payments service's child
//     saga that Book Trip starts as its pivot step (ChargeTrip): authorize
//     the card, screen the payment, capture the funds; its outcome answers
//     the parent (TripCharged or PaymentDeclined).
//   - Travellers, Flights, Hotels, Cars, Insurance, Cards, Fraud and Trip:
//     the participants, each implementing its generated <Service>Participant
//     interface. Travellers validate (a check step, nothing to undo) and
//     publish the destination's entry permit decision with their reply
//     (the event an external check step waits for);
//     flights, hotels and cars hold one unit of their inventory for a trip
//     and give it back when the saga compensates; insurance issues and
//     voids a policy (its insurer fails each purchase a few times: the
//     insurance commands declare retry tiers of their own); cards authorize, void and capture, and fraud screens,
//     for the Payment saga; trip records the booked trip and publishes
//     TripBooked in the same transaction.
//   - Itinerary: the subscriber of TripBooked (choreography): it sends the
//     traveller the itinerary, once per trip, and schedules the check-in
//     reminder for the day before the flight (ScheduleCheckInReminder: the
//     message waits in PostgreSQL until due).
//   - Notifications: the subscriber of CheckInReminder: it sends the
//     reminder; one handled after check-in closed is parked as expired.
//   - Migrations: the services' own tables, and travel_ledger, the journal
//     of every business effect.
//
// Register puts all of it on a host (runtime/host), which does the rest:
// migrations, topology, consumers, relays, the timeout scanner, the HTTP
// endpoints and the shutdown order. cmd/travel runs it as a service
// (host.Main).
package app
