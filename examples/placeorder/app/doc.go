// Package app is the Place Order example's business code: what a team writes
// around the generated packages under shop/, and nothing else.
//
//   - Decider: the saga's business decisions (saga data from the request,
//     each command built from the saga data, replies folded back into it).
//   - Inventory, Payment, Shipping and Approval: the four participants, each
//     implementing its generated <Service>Participant interface. Each effect
//     runs in the consumer's transaction together with the inbox claim and
//     the reply's outbox row. Business failures (out of stock, card
//     declined) are replies; errors are for "cannot process now" and are
//     retried, then parked.
//   - CarrierManifests: the carriers' pickup manifests, a resource outside
//     the shop's database. Shipping adds each booking to its carrier's under
//     the carrier's lease from runtime/lock (PostgreSQL), and the manifest
//     refuses a write whose fencing token is older than one it has seen
//     (RegisterWithManifests; Register leaves the manifests out).
//   - Migrations: the services' own tables.
//
// Register puts all of it on a host (runtime/host), which does the rest:
// migrations, topology, consumers, relays, the timeout scanner, the HTTP
// endpoints, the shutdown order. The host runs each command once per
// idempotency key, so a command the saga resends after a timeout gets the
// first reply again, and a compensation that overtakes its command makes
// the command a no-op: none of that is in this package.
//
// cmd/placeorder runs it as a service (host.Main); cmd/demo drives a fleet of
// orders through every path of the saga, with faults injected by
// examples/placeorder/internal/script; internal/chaos runs it as a fleet of
// processes under kills and restarts.
package app
