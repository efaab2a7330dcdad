-- Running outbox relays that hold their liveness lock (see runtime/outbox,
-- liveness.go): a relay registers once it holds the session advisory lock
-- lock_key and deletes its row when it stops. Other relays release the
-- leased rows of a registered owner whose lock has been free for grace_ms
-- (free_since: when one of them first found it free), then delete its row.
CREATE TABLE saga_outbox_relays (
  owner text PRIMARY KEY,
  lock_key bigint NOT NULL,
  grace_ms bigint NOT NULL,
  registered_at timestamptz NOT NULL DEFAULT now(),
  free_since timestamptz
);
