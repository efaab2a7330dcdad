package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pruneBatch bounds how many rows one statement of [Prune] deletes, so that
// no statement holds many row locks or runs for long.
const pruneBatch = 5000

// pruneSQL deletes, from the head of saga_outbox_sent in id order, the
// rows published before $1 up to the first one published since, at most
// $2, together with their outbox rows. Outbox rows are locked first and
// skipped when locked (an operator's Republish of that message holds its
// row): the lock order is the one Republish takes, so the two never
// deadlock. A row that is pending again (a late settle recorded a replayed
// row as sent) is not deleted.
const pruneSQL = `
WITH head AS (
  SELECT id, published_at FROM saga_outbox_sent ORDER BY id LIMIT $2
), cut AS (
  SELECT min(id) AS first_new FROM head WHERE published_at >= $1
), doomed AS (
  SELECT o.id FROM saga_outbox o, head, cut
  WHERE o.id = head.id AND head.published_at < $1 AND (cut.first_new IS NULL OR head.id < cut.first_new)
    AND NOT EXISTS (SELECT FROM saga_outbox_pending p WHERE p.id = o.id)
  FOR UPDATE OF o SKIP LOCKED
), sent AS (
  DELETE FROM saga_outbox_sent s USING doomed WHERE s.id = doomed.id
)
DELETE FROM saga_outbox o USING doomed WHERE o.id = doomed.id`

// Prune deletes outbox rows published before olderThan, with their
// saga_outbox_sent records, in batches, and returns how many it deleted.
// Unpublished rows are never deleted, however old.
//
// It walks the published rows in id order and stops at the first one
// published at or after olderThan, so a row published long after its
// insert (it waited for the broker, or was replayed) holds back the
// pruning of older ids behind it until it is old enough itself; each batch
// reads only the rows it deletes and one more. Rows an operator is
// replaying at that moment are skipped.
//
// What a pruned row took with it: the saga's timeline no longer lists the
// message, and [Republish] of its message id enqueues a new row instead of
// releasing the old one (consumers' inboxes still drop a message they
// applied, as long as their own claims are kept; see inbox.Prune).
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Time) (int64, error) {
	var total int64
	for {
		tag, err := pool.Exec(ctx, pruneSQL, olderThan, pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune outbox rows published before %s: %w", olderThan.Format(time.RFC3339), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}
