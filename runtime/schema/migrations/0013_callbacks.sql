-- Durable HTTP callbacks (package callback): one row per delivery a saga's
-- outcome owes a client, written in the transaction of the transition that
-- reached the outcome, delivered by the dispatcher. id is the callback id
-- the receiver deduplicates by; body is the exact JSON sent on every attempt.
-- A row is pending until delivered_at or parked_at is set; endpoint_key
-- groups rows for the per-endpoint concurrency limit (the URL's scheme and
-- host, or "client:NAME" for a client's registered endpoint). The retry
-- budget's age counts from budget_from (written, or last replayed).
CREATE TABLE saga_callback (
  id uuid PRIMARY KEY,
  saga_id text NOT NULL, saga_type text NOT NULL,
  event text NOT NULL,
  url text NOT NULL DEFAULT '', client text NOT NULL DEFAULT '',
  endpoint_key text NOT NULL,
  body bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  budget_from timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_owner text, lease_until timestamptz,
  last_status integer NOT NULL DEFAULT 0, last_error text NOT NULL DEFAULT '',
  delivered_at timestamptz,
  parked_at timestamptz, park_reason text NOT NULL DEFAULT ''
);
CREATE INDEX saga_callback_due ON saga_callback (next_attempt_at) WHERE delivered_at IS NULL AND parked_at IS NULL;
CREATE INDEX saga_callback_saga ON saga_callback (saga_id, created_at);
CREATE INDEX saga_callback_parked ON saga_callback (parked_at) WHERE parked_at IS NOT NULL AND delivered_at IS NULL;

-- Operator actions on callbacks (a parked delivery replayed): who, when, why.
CREATE TABLE saga_callback_audit (
  id bigserial PRIMARY KEY,
  callback_id uuid NOT NULL REFERENCES saga_callback (id),
  action text NOT NULL, operator text NOT NULL, reason text NOT NULL,
  at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_callback_audit_callback ON saga_callback_audit (callback_id, id);
