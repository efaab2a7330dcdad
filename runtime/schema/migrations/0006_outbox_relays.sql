-- Running outbox relays that hold their liveness lock (see runtime/outbox,
-- liveness.go): a relay registers once it holds the session advisory lock
-- named after its owner and deletes its row when it stops. Other relays
-- release the leased rows of a registered owner whose lock has been free
-- for a while (free_since), then delete its row.
CREATE TABLE saga_outbox_relays (
  owner text PRIMARY KEY,
  registered_at timestamptz NOT NULL DEFAULT now(),
  free_since timestamptz
);
