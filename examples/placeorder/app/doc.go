// Package app wires the Place Order example onto the saga runtime: the code a
// team writes around the generated packages under shop/, and nothing else.
//
// # What the team writes
//
//   - Decider: the saga's business decisions (saga data from the request,
//     each command built from the saga data, replies folded back into it).
//   - Inventory, Payment, Shipping and Approval: the four participants, each
//     implementing its generated <Service>Participant interface. Each effect
//     runs in the consumer's transaction together with the inbox claim and
//     the reply's outbox row, and is guarded by participant.Idempotent, so a
//     command the saga resends after a timeout (new message id, same
//     idempotency key) gets the first reply again and has no second effect.
//     Business failures (out of stock, card declined) are replies; errors
//     are for "cannot process now" and are retried, then parked.
//   - App: the process wiring below.
//
// # Wiring (New, then Run)
//
//  1. schema.Migrate applies the runtime's tables, participant.Migrations,
//     orderv1.PlaceOrderMigrations() and the services' own tables
//     (Migrations) in one transaction under an advisory lock; any number of
//     processes may start at once. Engine.CheckStates then refuses to start
//     when the saga table holds instances in states the definition does not
//     have, or refuses one of its states (a rolled-back release).
//  2. Two broker connections: one publishes (relays, retry and parking
//     copies), one consumes, so a publisher blocked by the broker's flow
//     control never stalls acknowledgements.
//  3. broker.Declare declares the merged topology of the inventory, payment,
//     shipping and order packages; every work queue gets the tier queues of
//     the configured retry policy (Config.Retry) and a parking lot.
//  4. Run starts Config.Relays outbox relays, one consumer per participant
//     queue (the queue the generated Register function names), one consumer
//     for the saga's reply queue (PlaceOrder.Handler) and the saga's timeout
//     scanner. Everything is safe to run in several processes against one
//     database and one broker.
//
// Starting a saga is one call, PlaceOrder.Start (or StartTx inside the
// caller's own transaction); its first command waits in the outbox until a
// relay publishes it — at once, handed over after the commit, when the
// context comes from App.WithRelay.
//
// # Faults on demand
//
// Script injects faults per order id and command type — transient errors,
// replies held back (a participant that never answers, or answers late with
// SendHeldReply), replies sent twice — so the end-to-end test and the demo
// (cmd/demo) drive every path of the saga through the real runtime.
// Business failures come from data: a product without stock, DeclinedCard.
// Config.Now is the saga engine's clock; moving it forward fires the
// contract's step timeouts (30 s to 1 min) without waiting for them;
// Config.StepTimeouts shortens them for real (saga.Config.StepTimeouts).
//
// # Roles, random faults and crash points (the chaos soak)
//
// Config.Roles picks the parts one process runs (Role: relay, orchestrator,
// one role per participant service), so that one binary can be deployed as
// a fleet of processes (internal/chaos runs it that way). Faults injects
// random participant faults — transient errors, replies held back past the
// step timeout, duplicate replies — decided by a seeded hash of each
// delivery, so that every process agrees. Crashes arms named crash points
// (CrashPoint): after a consumer's commit and before its ack, after a
// relay's confirmed publish and before its mark, in the middle of a
// compensation and after a compensation committed; the runtime's points are
// observed through the pgx tracer Crashes.Tracer installs on the pool.
package app
