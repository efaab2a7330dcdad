package participant

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/internal/retain"
)

// pruneBatch bounds the once records one prune statement deletes.
const pruneBatch = 1000

// pruneOnceSQL deletes up to $2 of service $3's once records written
// before $1, oldest first (pruneAllOnceSQL: of every service); rows another
// transaction holds are left for the next prune.
const pruneAllOnceSQL = `
DELETE FROM saga_participant_once
WHERE (service, idempotency_key) IN (
  SELECT service, idempotency_key FROM saga_participant_once
  WHERE first_at < $1
  ORDER BY first_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`

const pruneOnceSQL = `
DELETE FROM saga_participant_once
WHERE service = $3 AND idempotency_key = ANY(ARRAY(
  SELECT idempotency_key FROM saga_participant_once
  WHERE service = $3 AND first_at < $1
  ORDER BY first_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
))`

// PruneOnce deletes service's once records written before olderThan and
// returns how many it deleted. A command that comes again after its record
// is gone runs again (and a compensation's record that waited for an
// overtaken command no longer stops it), so keep records far longer than
// any saga resends a command: a host prunes them with its inbox claims,
// under host.Config.KeepClaims (default 30 days).
func PruneOnce(ctx context.Context, pool *pgxpool.Pool, service string, olderThan time.Time) (int64, error) {
	what := fmt.Sprintf("prune once records of service %q before %s", service, olderThan.Format(time.RFC3339))
	return retain.Batches(ctx, pool, what, pruneOnceSQL, olderThan, pruneBatch, service)
}

// PruneAllOnce is [PruneOnce] for every service's records, as sagactl prune
// runs it.
func PruneAllOnce(ctx context.Context, pool *pgxpool.Pool, olderThan time.Time) (int64, error) {
	return retain.Batches(ctx, pool, "prune once records before "+olderThan.Format(time.RFC3339), pruneAllOnceSQL, olderThan, pruneBatch)
}
