// Package saga is the saga engine: it persists the instances of one saga type
// in PostgreSQL and drives them through the pure state machine of package
// sagadef.
//
// # One transaction per step
//
// Everything that happens to an instance happens in one database
// transaction, in this order:
//
//	load    SELECT ... FOR UPDATE the instance row (by saga id, or by business key)
//	classify/transition   sagadef.Definition.Apply: new, duplicate, late, conflicting, invalid, early
//	persist UPDATE ... WHERE id = $1 AND version = $2 (only if something changed)
//	outbox  outbox.Enqueue the commands the transition emits
//	audit   INSERT INTO saga_audit: from, to, trigger, class, message and causation ids, operator, note
//
// For a reply, the consumer opens that transaction (the engine is the
// consumer's consumer.BatchHandler, [Engine.HandleBatch], which locks the
// batch's instances at once and applies each delivery with [Engine.Handle])
// and acknowledges the delivery only after the commit. A consumer that
// claims every delivery in the inbox drops a redelivery before the engine
// sees it; a host's saga queue claims nothing (consumer.Config.HandlerDedupes)
// and the engine drops a redelivery itself: a message it applied as new is
// recorded in the instance (a duplicate the second time), and one of any
// other class is claimed in the inbox when it is handled (see
// Engine.Handle). For a start it is
// the caller's transaction ([Engine.StartTx]) or one of its own
// ([Engine.Start]); timeouts and operator actions open their own.
//
// # Invariants
//
//   - A state change and the messages it causes commit together or not at
//     all: emitted commands are outbox rows in the transition's transaction.
//   - Concurrent messages for one instance serialize on its row lock. The
//     version guard on the update is a second line: a writer that did not
//     hold the lock can never overwrite a newer version (it fails instead).
//   - The version increases by exactly one per persisted change; a
//     duplicate, an ignored late reply or an invalid message changes nothing
//     and keeps the version, but is still audited.
//   - Every outcome — transitions, duplicates, late, conflicting, invalid and early
//     messages, timeouts, repeated starts and operator actions — writes one
//     audit row naming its cause (message id and causation id, or operator
//     and reason).
//   - Starting is idempotent on the business key (a unique column): a second
//     start returns the first instance's id and sends nothing.
//   - Timeouts live in the database (timeout_at, deadline_at), not in broker
//     TTLs. Scanners claim due rows with FOR UPDATE SKIP LOCKED, so any number
//     of them may run, and each claims only rows in states its definition
//     knows (during a rolling upgrade, a step only the new release has is
//     left to the new release's scanners); a claimed row is re-checked against its newest
//     version, so a timeout that raced a reply which already moved the
//     instance on does not fire. A reply that arrives after the timeout fired
//     is classified late and does what the late-reply table says
//     (docs/options.md, "Late replies"; the step's late-reply policy
//     where the table leaves the choice to it).
//   - Operator actions name the version they decided on; if anything moved
//     the instance since, they fail with [ErrVersionConflict] and change
//     nothing. Each records who and why.
//   - Rows are never deleted by the engine, so a late or duplicate message
//     always finds its instance; a message for an unknown instance is a
//     permanent failure (parked with the reason).
//
// # Saga ids and message ids
//
// Saga ids and the ids of emitted commands come from Config.NewID (UUIDv7 by
// default); the machine records the id of every command it sends in the
// instance's progress, so a reply's causation id tells which attempt of which
// step it answers. Emitted envelopes carry CorrelationID = SagaID = the saga
// id, SagaType = the definition's name, and CausationID = the message that
// triggered the transition (empty for timeouts and operator actions).
//
// # Child sagas
//
// A saga that declares outcome replies (sagadef.Definition.Replies) can be
// a parent's child: its start and cancel messages arrive with the parent's
// saga id and type in the envelope. [Engine.Handle] starts the instance
// from such a start (idempotently on the business key), finds it for such a
// cancel by the message's correlation key, and records the parent in the
// instance's progress (sagadef.Parent). The transition that ends the
// instance writes the outcome reply into the outbox in its own
// transaction, addressed to the parent (its saga id, type and correlation
// id; causation = the start command's id, or the parent's cancel's for the
// cancelled reply), so the parent's engine classifies it like any reply.
//
// # Application code: reads, HTTP and cancels
//
// [Engine.Status], [Engine.StatusByBusinessKey] and [Engine.List] (one
// page, newest first, by states, business key, update time or stuck rule;
// the one listing query of an instance table, which the admin API uses
// too) read instances; generated code wraps them with its state and data
// types ([Snapshot], [Get], [GetByID], [List]). [Engine.StartHandler]
// starts sagas over HTTP and [Engine.StatusHandler] reports on them; both
// answer failures the client did not cause with a reference to a log line
// instead of the error's text. [Engine.RequestCancelTx] writes the
// contract's business cancel message to the outbox; [Engine.Handle]
// applies it (sagadef.Cancel) with who asked and why in its audit row.
//
// # Tables
//
// The instance table is generated per saga (see docs/architecture.md): the
// engine reads and writes exactly its documented columns. saga_outbox and
// saga_audit come from package schema.
package saga
