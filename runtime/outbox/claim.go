package outbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

const claimSQL = `
WITH claimed AS (
  UPDATE saga_outbox_pending
  SET lease_owner = $1, lease_until = now() + $2 * interval '1 millisecond', attempts = attempts + 1
  WHERE id = ANY(ARRAY(
    SELECT id FROM saga_outbox_pending
    WHERE lease_until IS NULL OR lease_until < now()
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
  ))
  RETURNING id, attempts, pending_since
)
SELECT c.id, c.attempts, CASE WHEN c.pending_since > o.created_at THEN c.pending_since END, o.id IS NULL,
  coalesce(o.message_id, ''), coalesce(o.exchange, ''), coalesce(o.routing_key, ''), coalesce(o.message_type, ''),
  coalesce(o.schema_version, 0), coalesce(o.correlation_id, ''), coalesce(o.causation_id, ''),
  coalesce(o.saga_id, ''), coalesce(o.saga_type, ''), coalesce(o.idempotency_key, ''),
  coalesce(o.traceparent, ''), coalesce(o.tracestate, ''), o.headers, o.body, coalesce(o.occurred_at, 'epoch')
FROM claimed c LEFT JOIN LATERAL (SELECT * FROM saga_outbox WHERE id = c.id OFFSET 0) o ON true`

// dropOrphansSQL deletes pending rows whose outbox row is gone (deleted by
// hand: nothing the runtime does deletes an outbox row that is still
// pending), while they are still under the claim that found them.
const dropOrphansSQL = `
DELETE FROM saga_outbox_pending p
USING unnest($1::bigint[], $2::int4[]) AS d(id, attempts)
WHERE p.id = d.id AND p.attempts = d.attempts AND p.lease_owner = $3
  AND NOT EXISTS (SELECT FROM saga_outbox o WHERE o.id = p.id)
RETURNING p.id`

// claim leases up to BatchSize publishable rows to this relay, in one
// committed statement, and reads their messages from saga_outbox. The ids
// are collected into an array first so that the rows are then found through
// the primary key: written as id IN (subquery), the planner may hash-join
// the subquery against a sequential scan of the whole table. The array
// keeps the pending rows' update on the primary key. The
// join to saga_outbox after it looks each row up by id: OFFSET 0 keeps the
// lateral subquery from being flattened into a plain join, which a generic
// plan built while saga_outbox was new (never analyzed: 10 pages assumed)
// made a hash join over a sequential scan of the whole outbox, kept as the
// outbox grew (see TestClaimPlanOnANewTable).
//
// A claimed pending row whose outbox row is gone has nothing to publish;
// claim deletes it (see dropOrphans) instead of leasing it again every
// LeaseDuration for ever.
func (r *Relay) claim(ctx context.Context) ([]row, error) {
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.cfg.Owner, r.cfg.LeaseDuration.Milliseconds(), r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	var (
		out     []row
		rw      row
		orphan  bool
		orphans []row
		headers []byte
	)
	e := &rw.env
	_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.attempts, &rw.pendingSince, &orphan, &e.MessageID, &e.Exchange, &e.RoutingKey, &e.MessageType,
		&e.SchemaVersion, &e.CorrelationID, &e.CausationID, &e.SagaID, &e.SagaType, &e.IdempotencyKey,
		&e.Traceparent, &e.Tracestate, &headers, &e.Body, &e.OccurredAt}, func() error {
		if orphan {
			orphans = append(orphans, row{id: rw.id, attempts: rw.attempts})
			return nil
		}
		e.Headers = r.decodeHeaders(rw.id, e.MessageID, headers)
		e.OccurredAt = e.OccurredAt.UTC()
		out = append(out, rw)
		return nil
	})
	if err != nil {
		// The lease runs out by itself; nothing to undo.
		return nil, fmt.Errorf("claim outbox batch: %w", err)
	}
	if len(orphans) > 0 {
		r.dropOrphans(ctx, orphans)
	}
	slices.SortFunc(out, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// dropOrphans deletes claimed pending rows that have no outbox row, and
// says which. Failing, it only logs: the rows stay leased and are found
// again when the lease runs out.
func (r *Relay) dropOrphans(ctx context.Context, orphans []row) {
	ids := make([]int64, len(orphans))
	attempts := make([]int32, len(orphans))
	for i, o := range orphans {
		ids[i], attempts[i] = o.id, o.attempts
	}
	rows, err := r.cfg.Pool.Query(ctx, dropOrphansSQL, ids, attempts, r.cfg.Owner)
	var dropped []int64
	if err == nil {
		dropped, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		r.cfg.Logger.Warn("outbox relay: could not delete pending rows whose outbox row is gone; they are claimed again when their lease runs out",
			"owner", r.cfg.Owner, "outbox_ids", ids, "error", err)
		return
	}
	r.orphans.Add(int64(len(dropped)))
	r.cfg.Logger.Error("outbox relay: pending rows had no outbox row (deleted from saga_outbox by hand?); nothing to publish, their pending rows are deleted",
		"owner", r.cfg.Owner, "outbox_ids", dropped)
}

// decodeHeaders reads a row's headers column as the relay publishes it.
func (r *Relay) decodeHeaders(id int64, messageID string, headers []byte) map[string]any {
	if len(headers) == 0 || bytes.Equal(headers, []byte("{}")) {
		return nil
	}
	var h map[string]any
	dec := json.NewDecoder(bytes.NewReader(headers))
	dec.UseNumber() // keep integers integers
	if err := dec.Decode(&h); err != nil {
		// Enqueue writes only JSON objects; a row written by other means
		// is published without its extra headers rather than blocking
		// every row behind it.
		r.cfg.Logger.Error("outbox relay: headers are not a JSON object; publishing without them",
			"outbox_id", id, "message_id", messageID, "error", err)
		return nil
	}
	return h
}
