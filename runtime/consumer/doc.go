// Package consumer consumes a RabbitMQ work queue into PostgreSQL with
// exactly-once effects: every delivery is decoded, claimed in the inbox and
// handled in one database transaction, and acknowledged only after that
// transaction committed. Failures are classified and routed — delayed retry
// through TTL tier queues, or the parking lot — so that no message is ever
// lost and none loops hot.
//
// # One delivery's path
//
//  1. Decode: message.FromDelivery, registry lookup of the message type,
//     schema version check (a version newer than the registered
//     message.Info.SchemaVersion is not understood), protobuf decode. Any
//     failure here is permanent: the message is parked at once, without
//     calling the handler.
//  2. Transaction: inbox.Claim(Config.Name, message id). A message already
//     claimed is a duplicate: committed and acknowledged without calling
//     the handler. Otherwise the batch handler (Config.Batch, or
//     Config.Handler run as one) applies it in the same transaction. A
//     handler that drops a redelivery itself by rows of its own
//     (Config.HandlerDedupes: a host's participants, whose once record
//     names the message id, and a host's saga engines, whose instances
//     record what they applied and which claim the rest themselves) is
//     handed every delivery unclaimed.
//  3. Commit, then acknowledge. Between the two, the outbox rows the
//     batch's successful handlers wrote go to the relay of this process
//     when the consumer has one (Config.Relay), or the relays are woken by
//     a notification.
//
// # Batches share commits
//
// A commit costs an fsync, the scarce resource. With BatchSize > 1 a worker
// takes the deliveries already waiting (never waiting for more) and applies
// them in one transaction. It first tries the fast path: one statement
// claims every delivery in the inbox, and the consumer hands the deliveries
// claimed first to the BatchHandler, without savepoints, on the batch's
// transaction (a txq.Tx carrying the batch's stage and wake set). The saga
// engine and participant.BatchHandler read what the batch needs in one
// statement (the engine locks its instances, a participant reads its once
// records),
// then apply each delivery, the writes each one queued through the runtime
// (participant replies, participant.Defer) sent in one round trip when it
// returns, and
// the saga instance updates, outbox rows and audit rows of all of them
// written by one statement per kind before the commit (a row inserted with
// 63 others costs PostgreSQL a fraction of one inserted alone). Until
// then those tables do not hold the batch's rows: a handler's own SQL that
// reads them in tx sees them as they were before the batch (the runtime's
// reads see the staged rows; a savepoint a handler begins writes them
// first), and triggers on them fire at that last statement. If a handler
// fails, or those last statements do (no attempt is charged then: which
// handler wrote the bad row is not known, and it runs again), or the
// batch handler fails the batch as a whole (FailBatch: no attempt is
// charged either), the
// transaction rolls back and the batch is applied again with a savepoint
// per delivery, handing the batch handler one delivery at a time (a failed
// delivery is not run again; a deadlock or
// serialization failure charges no delivery): a failing delivery rolls back
// only its savepoint and is routed, while the others commit together. So a
// handler can run twice for one delivery without a redelivery, its first
// run rolled back: keep effects outside the transaction idempotent, as
// at-least-once delivery requires anyway. Either way the batch is acknowledged after the one commit
// — with a single multiple-ack when no other worker holds a lower delivery
// tag on the channel, individually otherwise. If the server rejects the shared commit
// itself (a deferred constraint, a serialization failure), the batch is
// applied again one delivery per transaction, which isolates the culprit; a
// single delivery whose commit is rejected is routed by the commit error's
// class.
//
// # Failure routing
//
// A handler error is classified with runtime/retry:
//
//   - permanent: parked at once;
//   - transient or unknown (including a recovered panic): republished to
//     the tier queue of its attempt (broker.TierQueue, through the default
//     exchange) with HeaderAttempt + 1, HeaderFirstFailureAt,
//     HeaderLastError and the original exchange and routing key; the tier
//     queue dead-letters it back to the work queue when its TTL expires.
//     When retry.Policy.TierFor says the budget is spent, it is parked.
//     Run refuses to start on a tier queue that exists with another TTL,
//     no dead-lettering or another dead-letter target than broker.WorkQueue
//     gives it: every retry through it would be dropped or misrouted when
//     it expires. Other arguments (a lazy classic queue, a delivery limit)
//     are logged, not refused.
//     The attempt is charged when the copy is confirmed: a copy that
//     cannot be published leaves the delivery unacknowledged, and it is
//     handled again at the same attempt after the session's backoff. A
//     crash after the copy is confirmed and before the original's ack
//     forks the message: the original comes again at the same attempt
//     while its copy waits, and each copy spends the rest of the budget
//     (with MaxAttempts 3, a fork after attempt 1 runs the handler six
//     times — attempt 1 twice, attempts 2 and 3 once per copy — and parks
//     two copies). The inbox keeps a success to one effect.
//
// Parking inserts a saga_parked row (reason, class "permanent" or
// "exhausted", attempts, original exchange/routing key/queue, headers,
// body, saga id) in the batch's transaction and, after the commit,
// publishes the message to broker.ParkingQueue with the reason and origin
// in the message.HeaderPark*/HeaderOrig* headers. Retry copies and parked
// messages are published with mandatory publisher confirms
// (broker.Publisher); only when the broker confirmed and routed the copy is
// the original acknowledged.
//
// A handler that breaks its transaction is a fault of the delivery, not of
// the database, and is routed like any failure rather than retried in
// place: a handler that ignores a failed statement and returns nil fails as
// unclassified; a handler that commits or rolls back the savepoint it was
// given is parked as permanent (the batch is first rolled back and applied
// one delivery per transaction, since the effects it released into the
// shared transaction cannot be undone alone). A message id the inbox cannot
// store (not UTF-8 text) is an invalid envelope.
//
// # Never drop, never spin
//
// The consumer never nacks. Nack with requeue=false drops the message (or
// dead-letters it somewhere the consumer does not control); nack with
// requeue=true hands it straight back, which is a hot loop. When a
// delivery cannot be settled — the database is unreachable, the commit
// failed, a retry or parking publish was not confirmed — it is simply not
// acknowledged: the worker reports the failure, the session stops
// consuming, lets the other workers finish and acknowledge their batches,
// closes the channel (the broker requeues every unacknowledged delivery)
// and the consumer starts a new session after an exponential, jittered
// backoff, once the database answers a ping again. Redelivery after a
// committed-but-unacknowledged batch is harmless: the inbox recognizes the
// messages. Infrastructure failures do not spend a message's retry
// attempts; only failures of the message itself do.
//
// # Connections and shutdown
//
// Give the consumer a connection of its own (Config.Conn) and, ideally,
// publish its retry and parking copies on the application's publishing
// connection (Config.PublishConn). A session consumes on one channel with
// QoS prefetch Config.Prefetch and Config.Concurrency workers. Delivery tags
// belong to their channel, so every acknowledgement goes through the
// session's acker, which refuses to acknowledge once the session has begun
// to close its channel: a delivery from a dead channel is never acknowledged
// on a new one, and nothing is acknowledged after close. When the channel
// or connection is lost, the session ends and a new one waits for
// broker.Conn to reconnect, then subscribes again.
//
// Cancelling Run's context shuts down gracefully: the consumer cancels its
// subscription, lets the in-flight batches finish (their handlers keep an
// uncancelled context for up to Config.DrainTimeout), acknowledges them,
// then closes the channel; prefetched deliveries nobody started return to
// the queue.
//
// # Invariants
//
//   - A delivery is acknowledged only after the transaction holding its
//     inbox claim and its handler's effects committed, or after its retry
//     copy or parked copy was confirmed by the broker (and, when parked,
//     its saga_parked row committed).
//   - Every message is handled with effect at most once per consumer name
//     (inbox) and, while the broker and database recover, at least once.
//   - A poison message is delivered at most Retry.MaxAttempts times through
//     the tiers (once if permanent) before it is parked.
package consumer
