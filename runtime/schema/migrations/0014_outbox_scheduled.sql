-- Scheduled messages (outbox.Schedule): an outbox row that is not to be
-- published before deliver_at waits here, with the outbox's columns,
-- instead of in saga_outbox, so the relay's claim never reads a row that is
-- not due. outbox.MoveDue moves due rows into saga_outbox (whose trigger
-- makes them pending for the relay) and deletes them here, in one
-- statement: a row is moved once, whoever moves it and whenever a process
-- stops.
CREATE TABLE saga_outbox_scheduled (
  id bigserial PRIMARY KEY,
  deliver_at timestamptz NOT NULL,
  message_id text NOT NULL UNIQUE,
  exchange text NOT NULL, routing_key text NOT NULL,
  message_type text NOT NULL, schema_version integer NOT NULL,
  correlation_id text NOT NULL DEFAULT '', causation_id text NOT NULL DEFAULT '',
  saga_id text NOT NULL DEFAULT '', saga_type text NOT NULL DEFAULT '',
  idempotency_key text NOT NULL DEFAULT '',
  traceparent text NOT NULL DEFAULT '', tracestate text NOT NULL DEFAULT '',
  headers jsonb NOT NULL DEFAULT '{}', body bytea NOT NULL,
  occurred_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_outbox_scheduled_due ON saga_outbox_scheduled (deliver_at, id);
