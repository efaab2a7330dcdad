package outbox

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pruneBatch bounds how many sent records one statement of [Prune] reads,
// so that no statement holds many row locks or runs for long.
const pruneBatch = 5000

// pruneSQL reads the next $2 sent records after id $3 (the head), and
// deletes those published before $1, up to the first one published since,
// with their outbox rows. Outbox rows are locked first and skipped when
// locked (an operator's Republish of that message holds its row): the lock
// order is the one Republish takes, so the two never deadlock. A row that
// has a pending row is not deleted, and an outbox row is deleted only when
// this statement deleted its sent record: a Republish that committed after
// the statement's snapshot deleted that record, and its row is pending
// again. It returns how many rows it deleted, the head's last id, its size,
// and whether the head reached a row published since $1.
const pruneSQL = `
WITH head AS (
  SELECT id, published_at FROM saga_outbox_sent WHERE id > $3 ORDER BY id LIMIT $2
), cut AS (
  SELECT min(id) AS first_new FROM head WHERE published_at >= $1
), doomed AS (
  SELECT o.id FROM saga_outbox o, head, cut
  WHERE o.id = head.id AND head.published_at < $1 AND (cut.first_new IS NULL OR head.id < cut.first_new)
    AND NOT EXISTS (SELECT FROM saga_outbox_pending p WHERE p.id = o.id)
  FOR UPDATE OF o SKIP LOCKED
), sent AS (
  DELETE FROM saga_outbox_sent s USING doomed WHERE s.id = doomed.id RETURNING s.id
), gone AS (
  DELETE FROM saga_outbox o USING sent WHERE o.id = sent.id RETURNING o.id
)
SELECT (SELECT count(*) FROM gone), coalesce((SELECT max(id) FROM head), 0), (SELECT count(*) FROM head),
  (SELECT first_new IS NOT NULL FROM cut)`

// Prune deletes outbox rows published before olderThan, with their
// saga_outbox_sent records, and returns how many it deleted. Unpublished
// rows are never deleted, however old.
//
// It walks the published rows in id order, at most 5,000 per statement, and
// stops at the first one published at or after olderThan, so a row
// published long after its insert (it waited for the broker, or was
// replayed) holds back the pruning of older ids behind it until it is old
// enough itself. Rows it cannot delete now (an operator is replaying the
// message, or its outbox row was deleted by hand) are passed over and left.
//
// What a pruned row took with it: the saga's timeline no longer lists the
// message, and [Republish] of its message id enqueues a new row instead of
// releasing the old one (consumers' inboxes still drop a message they
// applied, as long as their own claims are kept; see inbox.Prune).
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Time) (int64, error) {
	var total int64
	after := int64(math.MinInt64) // ids written by hand may be anything
	for {
		var (
			deleted, headSize int64
			reachedCut        bool
		)
		if err := pool.QueryRow(ctx, pruneSQL, olderThan, pruneBatch, after).Scan(&deleted, &after, &headSize, &reachedCut); err != nil {
			return total, fmt.Errorf("prune outbox rows published before %s: %w", olderThan.Format(time.RFC3339), err)
		}
		total += deleted
		if reachedCut || headSize < pruneBatch {
			return total, nil
		}
	}
}
