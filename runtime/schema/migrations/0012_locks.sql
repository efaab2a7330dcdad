-- Leases of runtime/lock's PostgreSQL locks: one row per lock name, kept
-- for good once created, so that its fencing token only grows. A lease is
-- held while owner <> '' and expires_at is in the future (by the database
-- clock); taking a free or expired lease increments token. A released lease
-- keeps its token, with owner ''.
CREATE TABLE saga_locks (
  name text PRIMARY KEY,
  owner text NOT NULL DEFAULT '',
  token bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  acquired_at timestamptz NOT NULL DEFAULT now()
);

-- The highest fencing token each fenced resource has accepted
-- (lock.FenceTx): a write carrying a lower token is refused.
CREATE TABLE saga_fences (
  resource text PRIMARY KEY,
  token bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Semantic locks (lock.MarkPendingTx): a business record that a saga in
-- flight has changed and not yet settled, marked pending by that saga.
-- Other sagas read the marker and refuse or wait instead of acting on a
-- value that may still be compensated.
CREATE TABLE saga_pending (
  resource text PRIMARY KEY,
  saga_id text NOT NULL,
  reason text NOT NULL DEFAULT '',
  marked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_pending_by_saga ON saga_pending (saga_id);
