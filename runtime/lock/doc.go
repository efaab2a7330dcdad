// Package lock gives participants leases on resources outside their own
// database, with fencing tokens, and semantic locks on business records.
//
// # When to use it
//
// A participant's effect on its own database needs no lock: it runs in the
// consumer's transaction, and row locks, constraints and conditional updates
// guard it. A lease is for the few effects that reach something else — a
// file on shared storage, a carrier's or bank's API, a device — where two
// processes must not work at once. docs/locks.md compares the options.
//
// # Leases
//
// A [Locker] hands out a [Lease] on a name for a time to live. It runs on a
// [Backend]: [Postgres] (the default: one row per name in saga_locks, by the
// database clock) or runtime/lock/redislock (SET NX PX with an owner token,
// for teams that already run Redis). Every lease carries a fencing token
// that is higher than the token of every earlier lease on the same name.
//
// # Invariants
//
//   - At most one owner holds a name's lease at a time, as the backend's
//     clock sees it. A lease taken with [Locker.Acquire] is the caller's
//     until its expiry; [Lease.Extend] moves the expiry, [Lease.Release]
//     ends it, and both succeed only for the owner that still holds it (a
//     random owner token per lease; no other process can release it).
//   - Fencing tokens of one name only grow, across releases, expiries and
//     (Redis) restarts that lost the counter.
//   - The lease alone does not protect the resource: a process that pauses
//     (a GC pause, a stalled VM, a slow network) past the expiry still
//     believes it holds it while the next owner works. The resource must
//     check the token where the effect is written and refuse a token lower
//     than one it has seen: [Fence] for a resource served by a Go process,
//     [FenceTx] for one stored in PostgreSQL, or the same condition in the
//     resource's own write.
//
// # Semantic locks
//
// [MarkPendingTx] marks a business record pending for the saga that changed
// it, in the participant's transaction, until [ClearPendingTx] (when the
// saga settled it, or compensated it) removes the mark. Other sagas see the
// mark ([PendingTx], or [MarkPendingTx] failing with [ErrPending]) and wait,
// retry or answer a business failure instead of acting on a value that may
// still be undone: the countermeasure to a saga's missing isolation.
//
// # Metrics
//
// With Config.Telemetry set, every request records saga.lock.wait and every
// lease's end saga.lock.hold (runtime/telemetry, [telemetry.LockMetrics]).
package lock
