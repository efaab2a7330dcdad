-- The runtime's own tables: transactional outbox, consumer inbox, transition
-- audit and the parked-message index. See docs/architecture.md.

CREATE TABLE saga_outbox (
  id bigserial PRIMARY KEY,
  message_id text NOT NULL UNIQUE,
  exchange text NOT NULL, routing_key text NOT NULL,
  message_type text NOT NULL, schema_version integer NOT NULL,
  correlation_id text NOT NULL DEFAULT '', causation_id text NOT NULL DEFAULT '',
  saga_id text NOT NULL DEFAULT '', saga_type text NOT NULL DEFAULT '',
  idempotency_key text NOT NULL DEFAULT '',
  traceparent text NOT NULL DEFAULT '', tracestate text NOT NULL DEFAULT '',
  headers jsonb NOT NULL DEFAULT '{}', body bytea NOT NULL,
  occurred_at timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  lease_owner text, lease_until timestamptz,
  published_at timestamptz
);
CREATE INDEX saga_outbox_unpublished ON saga_outbox (id) WHERE published_at IS NULL;

CREATE TABLE saga_inbox (
  consumer text NOT NULL, message_id text NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);

CREATE TABLE saga_audit (
  id bigserial PRIMARY KEY,
  saga_id uuid NOT NULL, saga_type text NOT NULL,
  from_state text NOT NULL, to_state text NOT NULL,
  trigger text NOT NULL,            -- message full name or sagadef.Trigger* constant
  class text NOT NULL,              -- new | duplicate | late | conflicting | invalid
  message_id text NOT NULL DEFAULT '', causation_id text NOT NULL DEFAULT '',
  operator text NOT NULL DEFAULT '', note text NOT NULL DEFAULT '',
  version bigint NOT NULL,          -- instance version after the transition
  at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_audit_saga ON saga_audit (saga_id, id);

CREATE TABLE saga_parked (
  id bigserial PRIMARY KEY,
  message_id text NOT NULL, queue text NOT NULL,
  message_type text NOT NULL DEFAULT '', saga_id text NOT NULL DEFAULT '', saga_type text NOT NULL DEFAULT '',
  correlation_id text NOT NULL DEFAULT '',
  class text NOT NULL,              -- permanent | exhausted
  reason text NOT NULL, attempts integer NOT NULL,
  exchange text NOT NULL DEFAULT '', routing_key text NOT NULL DEFAULT '',
  headers jsonb NOT NULL DEFAULT '{}', body bytea NOT NULL,
  first_failure_at timestamptz NOT NULL, parked_at timestamptz NOT NULL DEFAULT now(),
  replayed_at timestamptz, replayed_by text NOT NULL DEFAULT ''
);
CREATE INDEX saga_parked_saga ON saga_parked (saga_id);
