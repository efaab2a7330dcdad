-- The age of the outbox backlog (saga.outbox.oldest_age) and a publish's
-- delay (saga.outbox.publish.delay) were measured from the outbox row's
-- created_at and the message's occurred_at. An operator's replay of a parked
-- message (outbox.Republish) makes the original row pending again, so the
-- gauge reported the age of the original message — days — for a row that
-- had just been queued, and its publish recorded days of delay.
--
-- pending_since is when a pending row became pending: set by its default
-- when the insert trigger adds it (the writer's transaction time), and set
-- again by Republish. The gauge takes min(pending_since) in the same scan
-- of the pending rows that counts them, so no index is added and neither
-- the trigger nor the relay's claim and settle write anything more.
--
-- now() is STABLE, so PostgreSQL (11 and later) stores the default once in
-- the catalog instead of rewriting the table; ADD COLUMN takes an ACCESS
-- EXCLUSIVE lock on saga_outbox_pending only for that moment. The rows
-- pending at the upgrade get their outbox row's created_at, as the gauge
-- read it before (one update of the pending rows: the backlog, normally
-- small), which holds the lock, and blocks relays and writers of outbox
-- rows, until the migration commits.
ALTER TABLE saga_outbox_pending ADD COLUMN pending_since timestamptz NOT NULL DEFAULT now();

UPDATE saga_outbox_pending p SET pending_since = o.created_at
FROM saga_outbox o WHERE o.id = p.id;

-- The view shows it too (a new last column: CREATE OR REPLACE keeps the
-- others as they are).
CREATE OR REPLACE VIEW saga_outbox_state AS
SELECT o.id, o.message_id, o.exchange, o.routing_key, o.message_type,
  o.correlation_id, o.causation_id, o.saga_id, o.saga_type, o.created_at,
  o.lease_owner IS NOT NULL AS born_leased,
  coalesce(p.attempts, s.attempts, o.attempts) AS attempts,
  p.id IS NOT NULL AS pending, p.lease_owner, p.lease_until,
  s.published_at, s.relay AS published_by, p.pending_since
FROM saga_outbox o
LEFT JOIN saga_outbox_pending p ON p.id = o.id
LEFT JOIN saga_outbox_sent s ON s.id = o.id;
