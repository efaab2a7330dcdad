// Package callback delivers saga outcomes to clients as durable, signed
// HTTP callbacks.
//
// # Write path
//
// A saga whose contract declares callbacks (saga.v1 Saga.callback) writes
// one saga_callback row, in the transaction of the transition that reaches
// a declared state, through [EnqueueTx]: the outcome and its callback
// commit together or not at all (the outbox discipline). The row holds the
// exact JSON body ([Payload]) and a callback id that stays the same on
// every attempt.
//
// # Dispatcher
//
// A [Dispatcher] (run by the host next to the relays) claims due rows with
// FOR UPDATE SKIP LOCKED under a lease, so several processes dispatch
// safely, and POSTs each one outside any transaction:
//
//   - at most Config.PerEndpoint requests in flight per endpoint (a URL's
//     scheme and host, or a registered client), each bounded by
//     Config.Timeout;
//   - a 2xx answer acknowledges the delivery; 408, 429, 5xx, a timeout or a
//     network error is retried after an exponential backoff with full
//     jitter, or after the answer's Retry-After when it gives one; any other
//     answer (3xx, 4xx) is permanent and parks the row at once;
//   - the retry budget is Config.MaxAttempts attempts and Config.MaxAge
//     since the row was written; when either is spent the row is parked
//     with the reason;
//   - targets resolving to loopback, private, link-local, unspecified or
//     multicast addresses are refused (parked) unless Config.AllowPrivate
//     says otherwise; the check runs on the address actually dialled, so
//     a DNS answer that changes between check and connect cannot bypass it.
//
// Every attempt is signed (package signature). A crash between commit and
// delivery leaves the row pending; a crash between a delivery and its
// record leaves the row leased until the lease expires, after which it is
// delivered again with the same id and body: receivers deduplicate by the
// Saga-Callback-Id header.
//
// # Operators
//
// [List] reads a saga's deliveries; [Replay] sends a parked delivery again
// (same id) and records who asked and why in saga_callback_audit.
package callback
