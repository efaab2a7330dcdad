// Package chaos is the chaos soak of the Place Order example: it proves the
// failure matrix of docs/reliability.md with real processes and real servers.
//
// # The fleet
//
// The soak binary (examples/placeorder/cmd/soak) runs in two modes. As a
// node (RunNode) it is the Place Order application running some roles
// (Role): relays, orchestrators (the saga's reply consumer and timeout
// scanner) or participants. As the driver (Run) it builds the fleet — two
// relays, two orchestrators and several participant processes by default —
// from that one binary, and keeps it running: every node that dies is
// restarted by its supervisor (Fleet).
//
// # The faults
//
// While the driver starts sagas at a steady rate:
//
//   - participants fail at random (Faults, decided by a seeded hash of
//     each delivery): transient errors, replies held back past the step's
//     (short, overridden) timeout, duplicate replies; business failures come
//     from the orders (declined cards, products out of stock);
//   - nodes are SIGKILLed at named crash points (CrashPoint): a node
//     armed at a point announces it on its standard output ("CRASH point")
//     and stands still there until the driver kills it — after a
//     consumer's commit and before its ack, after a relay's confirmed
//     publish and before its mark, in the middle of a compensation and
//     after a compensation committed;
//   - nodes are SIGKILLed at random moments;
//   - RabbitMQ and PostgreSQL are restarted (testenv.Services). Restarting a
//     server breaks every client, so a run owns its servers: the tests and
//     the soak command start private ones.
//
// # The invariants
//
// After the load, the driver waits until every saga has ended (terminal or
// manual review), the outbox is empty and the queues are drained, stops the
// fleet and checks, from the database and the services' ledgers
// (shop_ledger): no saga lost; every saga terminal or in manual review with
// a reason; no business effect applied twice; the compensation applied
// exactly when the compensatable step completed, after every forward effect;
// stock conserved; every transition audited (an unbroken version chain);
// every committed outbox row published and consumed or parked by every queue
// it routes to; work and retry queues empty with nothing unacknowledged;
// parking lots holding exactly the parked messages, each with a reason and a
// saga; every saga's final outcome the last one its HTTP callback receiver
// was told (signatures verified, each callback id processed once), no
// callback parked or pending. The Report gives the figures and lists every violation.
package chaos
