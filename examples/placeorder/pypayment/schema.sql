-- The Python payment participant's own tables (payment.py applies this file
-- at start; every statement is idempotent). The business tables it writes,
-- payment_authorizations and shop_ledger, are the example's
-- (examples/placeorder/app/migrations).

-- Message ids this consumer has handled: a redelivery finds its id here and
-- has no second effect.
CREATE TABLE IF NOT EXISTS payment_py_inbox (
  message_id  text PRIMARY KEY,
  received_at timestamptz NOT NULL DEFAULT now()
);

-- One row per once key ("<command type>/<idempotency key>", with
-- "#operator-retry-<n>" for an operator's retry): the effect happened, or its
-- compensation came first (x-saga-compensates). The first reply is kept and
-- sent again for a resend of the command.
CREATE TABLE IF NOT EXISTS payment_py_once (
  once_key   text PRIMARY KEY,
  reply_type text NOT NULL DEFAULT '',
  reply_body bytea,
  first_at   timestamptz NOT NULL DEFAULT now()
);

-- Replies committed with their effect, published after the commit; a row
-- whose publish was not confirmed stays unpublished and goes out at the
-- next start or after the next command.
CREATE TABLE IF NOT EXISTS payment_py_outbox (
  id           bigserial PRIMARY KEY,
  message_id   text NOT NULL UNIQUE,
  exchange     text NOT NULL,
  routing_key  text NOT NULL,
  message_type text NOT NULL,
  correlation  text NOT NULL,
  headers      jsonb NOT NULL,
  occurred_at  timestamptz NOT NULL,
  body         bytea NOT NULL,
  published_at timestamptz
);
