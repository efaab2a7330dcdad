// Package inbox makes message handling idempotent: every consumed message is
// claimed in the saga_inbox table inside the same transaction as the
// handler's effects, keyed by (consumer, message id).
//
// # Invariants
//
//   - A claim and the effects of handling the message commit or roll back
//     together. So a message whose claim is committed has had its effects
//     exactly once, and a message whose transaction rolled back left no
//     claim behind and will be handled again when it is redelivered.
//   - A redelivery (the broker redelivers after a lost ack, the relay
//     republishes after a crash between publish and mark, an operator
//     replays a parked message) finds the claim and is acknowledged with no
//     second effect.
//   - Two deliveries of one message handled at the same time serialize on
//     the primary key: the second INSERT waits for the first transaction and
//     then either sees the committed claim (duplicate) or, if the first
//     rolled back, takes the claim itself. Neither transaction ever fails
//     with a unique violation.
//   - The consumer name is part of the key, so several consumers (a saga and
//     a projection, say) can each handle the same message once.
//
// Claims are needed only as long as a duplicate can still arrive. Each
// running consumer deletes its own claims once they are older than its
// KeepClaims (30 days by default) with [PruneConsumer]; [Prune] deletes
// every consumer's. Keep claims far beyond the longest redelivery window
// (retry tiers, relay lease timeout, parked-message replays): days, never
// minutes.
package inbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/internal/retain"
)

// pruneBatch bounds how many rows one DELETE statement of [Prune] removes, so
// pruning never holds many row locks or one long transaction.
const pruneBatch = 5000

// Claim records that consumer handles messageID within tx. It reports first
// = true when this is the first claim, in which case the caller runs the
// handler in the same tx; first = false means the message was already
// handled (and committed) by this consumer, so the caller commits and acks
// without calling the handler.
//
// If another transaction holds an uncommitted claim for the same key, Claim
// waits for it to finish.
func Claim(ctx context.Context, tx pgx.Tx, consumer, messageID string) (first bool, err error) {
	if consumer == "" {
		return false, fmt.Errorf("inbox claim message %q: empty consumer name", messageID)
	}
	if messageID == "" {
		return false, fmt.Errorf("inbox claim for consumer %q: empty message id", consumer)
	}
	tag, err := tx.Exec(ctx,
		`INSERT INTO saga_inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("inbox claim message %q for consumer %q: %w", messageID, consumer, err)
	}
	return tag.RowsAffected() == 1, nil
}

// claimedSQL reads which of a set of message ids a consumer has claimed.
// message_id = ANY(...) is a condition on the primary key's second column
// next to an equality on its first, an index scan whatever the statistics.
const claimedSQL = `SELECT message_id FROM saga_inbox WHERE consumer = $1 AND message_id = ANY($2::text[])`

// Claimed reports which of ids consumer has claimed: committed, or claimed
// earlier in tx. It writes nothing and waits for no other transaction, so
// it is only a hint for a handler that drops a redelivery by its own rows
// and claims only some deliveries (the saga engine): such a handler claims
// a delivery with [Claim] after all, which settles a race with a claim not
// yet committed. An empty ids reads nothing.
func Claimed(ctx context.Context, tx pgx.Tx, consumer string, ids []string) (map[string]bool, error) {
	claimed := map[string]bool{}
	if len(ids) == 0 {
		return claimed, nil
	}
	rows, err := tx.Query(ctx, claimedSQL, consumer, ids)
	if err == nil {
		err = collectClaimed(rows, claimed)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox read the claims of %d messages (first %q) for consumer %q: %w", len(ids), ids[0], consumer, err)
	}
	return claimed, nil
}

// QueueClaimed queues [Claimed]'s read on b, to be sent with other
// statements in one round trip: claimed receives the claimed ids when b's
// results are read. An empty ids queues nothing.
func QueueClaimed(b *pgx.Batch, consumer string, ids []string, claimed map[string]bool) {
	if len(ids) == 0 {
		return
	}
	b.Queue(claimedSQL, consumer, ids).Query(func(rows pgx.Rows) error {
		if err := collectClaimed(rows, claimed); err != nil {
			return fmt.Errorf("inbox read the claims of %d messages (first %q) for consumer %q: %w", len(ids), ids[0], consumer, err)
		}
		return nil
	})
}

func collectClaimed(rows pgx.Rows, claimed map[string]bool) error {
	var id string
	_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		claimed[id] = true
		return nil
	})
	return err
}

// ClaimAll claims every message id of ids for consumer in tx with one
// statement, with Claim's semantics for each: first[i] reports whether
// ids[i] is claimed for the first time. An id listed twice is first only at
// its first position. The rows are inserted in sorted order, so two
// transactions claiming overlapping sets wait for each other instead of
// deadlocking.
func ClaimAll(ctx context.Context, tx pgx.Tx, consumer string, ids []string) (first []bool, err error) {
	if consumer == "" {
		return nil, fmt.Errorf("inbox claim %d messages: empty consumer name", len(ids))
	}
	for i, id := range ids {
		if id == "" {
			return nil, fmt.Errorf("inbox claim for consumer %q: empty message id at position %d", consumer, i)
		}
	}
	first = make([]bool, len(ids))
	if len(ids) == 0 {
		return first, nil
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	rows, err := tx.Query(ctx, `
INSERT INTO saga_inbox (consumer, message_id)
SELECT $1, m FROM unnest($2::text[]) WITH ORDINALITY AS u(m, ord) ORDER BY ord
ON CONFLICT DO NOTHING
RETURNING message_id`, consumer, sorted)
	if err != nil {
		return nil, fmt.Errorf("inbox claim %d messages (first %q) for consumer %q: %w", len(ids), ids[0], consumer, err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox claim %d messages (first %q) for consumer %q: %w", len(ids), ids[0], consumer, err)
	}
	fresh := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		fresh[id] = true
	}
	for i, id := range ids {
		if fresh[id] {
			first[i] = true
			delete(fresh, id) // a second occurrence is a duplicate
		}
	}
	return first, nil
}

// Prune deletes the claims of every consumer received before olderThan, in
// batches, and returns how many it deleted. A message redelivered after its
// claim was pruned would be handled again, so olderThan must lie well before
// any possible redelivery. (Each running consumer of runtime/consumer
// prunes its own claims on its own; Prune is for a retention of your own,
// as sagactl prune runs it.)
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Time) (int64, error) {
	return retain.Batches(ctx, pool, "prune inbox claims before "+olderThan.Format(time.RFC3339), pruneAllSQL, olderThan, pruneBatch)
}

// PruneConsumer is [Prune] for the claims of one consumer only, read
// through the index on (consumer, received_at): a statement reads only
// what it deletes, so pruning often is cheap.
func PruneConsumer(ctx context.Context, pool *pgxpool.Pool, consumer string, olderThan time.Time) (int64, error) {
	what := fmt.Sprintf("prune inbox claims of consumer %q before %s", consumer, olderThan.Format(time.RFC3339))
	return retain.Batches(ctx, pool, what, pruneConsumerSQL, olderThan, pruneBatch, consumer)
}

// pruneAllSQL and pruneConsumerSQL delete up to $2 claims received before
// $1 (of consumer $3). pruneAllSQL reads the table in physical order until
// it has found $2 of them: sagactl prune runs it by hand.
const pruneAllSQL = `
DELETE FROM saga_inbox
WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM saga_inbox
  WHERE received_at < $1
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`

// pruneConsumerSQL collects the ids into an array first, oldest first, so
// that both the selection (index on consumer, received_at) and the delete
// (primary key) use an index under a generic plan; written as IN
// (subquery), PostgreSQL 15 scans the table and then all the consumer's
// claims.
const pruneConsumerSQL = `
DELETE FROM saga_inbox
WHERE consumer = $3 AND message_id = ANY(ARRAY(
  SELECT message_id FROM saga_inbox
  WHERE consumer = $3 AND received_at < $1
  ORDER BY received_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
))`
