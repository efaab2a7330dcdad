// Package app is the Quote Approval example's business code: what a team
// writes around the generated packages approval/v1, pricing/v1 and quote/v1,
// and nothing else.
//
//   - Decider: the saga's business decisions (saga data from the submitted
//     quote, each command built from the saga data, replies, the approval
//     and a cancel folded back into it).
//   - Pricing and Ordering: the two participants, each implementing its
//     generated <Service>Participant interface. Pricing holds a quote's
//     price (and releases it when the saga compensates); Ordering submits
//     the order of an approved quote.
//   - Decide: what the approval application calls when a person approves or
//     rejects a quote. It records the decision and publishes the generated
//     ApprovalGranted or ApprovalRejected event in the caller's transaction;
//     the saga waits for that event as its external Approval step.
//   - Migrations: the services' own tables.
//
// Register puts all of it on a host (runtime/host), which does the rest:
// migrations, topology, consumers, relays, the timeout scanner (the
// approval waits 72 hours, then the held price is released), the HTTP
// endpoints and the shutdown order. A quote is withdrawn with the generated
// QuoteApproval.Cancel or CancelTx: before the approval the held price is
// released and the saga ends CANCELLED; after it the cancel is refused
// (audited) and the order is submitted.
//
// cmd/quoteapproval runs it as a service (host.Main).
package app
