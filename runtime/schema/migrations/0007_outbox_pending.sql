-- An outbox row is written once and never updated. Whether it is published,
-- and the lease of the relay publishing it, live in two narrow tables:
--
--   saga_outbox_pending  one row per unpublished message: the relay's lease
--                        and how many times it was leased. A relay claims
--                        here and deletes the row once the broker confirms.
--   saga_outbox_sent     one row per published message: when, by which
--                        relay, after how many leases.
--
-- Before, the relay updated the outbox row itself twice (lease, then
-- published_at). Every update copies the whole row, body included, and the
-- second was never a HOT update (the unpublished index's predicate names
-- published_at), so it added an entry to each of the outbox's indexes.
--
-- A trigger adds the pending row of every inserted outbox row, whoever
-- writes it: the runtime, a process of an older version, or hand-written
-- SQL. Its lease_owner, lease_until and attempts columns say how the row was
-- born (leased to a local relay, or free); the live lease is the pending
-- row's.
--
-- saga_outbox_state joins the three for people and tests reading an
-- outbox row's whole story.
--
-- published_at is dropped so that a relay of an older version, which would
-- publish every row again, fails at its claim instead.
--
-- The lock comes first: an outbox row committed by a writer of the older
-- version after the copy below read the table, but before the trigger
-- existed, would have no pending row and never be published. Writers wait
-- for the migration instead (and a transaction already holding an insert
-- commits before the copy reads).
LOCK TABLE saga_outbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE saga_outbox_pending (
  id bigint PRIMARY KEY,
  attempts integer NOT NULL DEFAULT 0,
  lease_owner text,
  lease_until timestamptz
) WITH (fillfactor = 70);

CREATE TABLE saga_outbox_sent (
  id bigint PRIMARY KEY,
  published_at timestamptz NOT NULL,
  attempts integer NOT NULL,
  relay text NOT NULL
);

INSERT INTO saga_outbox_pending (id, attempts, lease_owner, lease_until)
SELECT id, attempts, lease_owner, lease_until FROM saga_outbox WHERE published_at IS NULL;

INSERT INTO saga_outbox_sent (id, published_at, attempts, relay)
SELECT id, published_at, attempts, coalesce(lease_owner, '') FROM saga_outbox WHERE published_at IS NOT NULL;

CREATE FUNCTION saga_outbox_pend() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO saga_outbox_pending (id, attempts, lease_owner, lease_until)
  SELECT id, attempts, lease_owner, lease_until FROM inserted;
  RETURN NULL;
END $$;

CREATE TRIGGER saga_outbox_pend AFTER INSERT ON saga_outbox
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION saga_outbox_pend();

ALTER TABLE saga_outbox DROP COLUMN published_at;
ALTER TABLE saga_outbox SET (fillfactor = 100);

CREATE VIEW saga_outbox_state AS
SELECT o.id, o.message_id, o.exchange, o.routing_key, o.message_type,
  o.correlation_id, o.causation_id, o.saga_id, o.saga_type, o.created_at,
  o.lease_owner IS NOT NULL AS born_leased,
  coalesce(p.attempts, s.attempts, o.attempts) AS attempts,
  p.id IS NOT NULL AS pending, p.lease_owner, p.lease_until,
  s.published_at, s.relay AS published_by
FROM saga_outbox o
LEFT JOIN saga_outbox_pending p ON p.id = o.id
LEFT JOIN saga_outbox_sent s ON s.id = o.id;
