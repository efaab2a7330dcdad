// Package retry says when a failed piece of work is tried again: it defines
// Policy, the one retry policy type of the runtime (how many times a message
// may be delivered before it is parked, and how long it waits between
// deliveries), the failure classes that decide whether a message is retried
// at all, and [Backoff], the one jittered exponential wait of the runtime
// (reconnects, relay retries).
//
// # Policy
//
// Delays are implemented by the broker, not by sleeping consumers: each
// distinct delay is a tier queue with that message TTL whose dead-letter
// target is the work queue (see runtime/broker). A failed message is
// republished to the tier of its attempt and comes back when the TTL expires.
// Because a tier queue holds only messages of one TTL, messages never wait
// behind a longer-lived one at the head of the queue. Tiers therefore have
// millisecond granularity (AMQP's x-message-ttl) and are strictly increasing,
// so every tier maps to exactly one queue.
//
// Attempts are counted from 1: the first delivery is attempt 1. MaxAttempts
// bounds the total number of deliveries, so a message is handled at most
// MaxAttempts times and waits at most MaxAttempts-1 times.
//
// # Failure classes
//
// The package also classifies the errors a message handler returns, so the
// consumer knows what to do with the delivery that caused them. There are
// three classes:
//
//   - [ClassTransient]: the same message may well succeed later (a
//     serialization failure, a deadlock, a lock timeout, a lost or refused
//     database connection, a deadline). The consumer retries it after a delay
//     through the retry tiers, up to the policy's attempt budget, then parks
//     it.
//   - [ClassPermanent]: the message can never succeed as it is (an
//     undecodable body, an unknown type, a schema mismatch, a validation or
//     constraint error). The consumer parks it at once: retrying only burns
//     capacity and delays the operator.
//   - [ClassUnknown]: everything else, including panics. The consumer treats it
//     like a transient failure with the same bounded budget, so a bug cannot
//     loop forever and a flaky dependency is not parked on its first hiccup.
//
// Handlers state what they know by wrapping: [Permanent] and [Transient] mark
// an error, and the outermost mark in the error chain wins, so a caller can
// reclassify an error a callee already marked. Unmarked errors are classified
// by what they are ([ClassOf] documents the rules). Marking never hides the
// wrapped error: errors.Is and errors.As see through it.
package retry
