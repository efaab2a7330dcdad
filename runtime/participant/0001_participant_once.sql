-- Effects a participant applied, keyed by the command's idempotency key, and
-- the first reply it sent for each (replayed when the command is resent).
CREATE TABLE saga_participant_once (
  service         text NOT NULL,
  idempotency_key text NOT NULL,
  reply_type      text NOT NULL DEFAULT '',
  reply_body      bytea,
  first_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (service, idempotency_key)
);
CREATE INDEX saga_participant_once_first_at ON saga_participant_once (first_at);
