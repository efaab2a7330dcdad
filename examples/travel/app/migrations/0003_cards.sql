-- cards: one authorization per trip, voided or captured.
CREATE TABLE card_authorizations (
  trip_id          text PRIMARY KEY,
  authorization_id text NOT NULL,
  currency         text NOT NULL,
  minor_units      bigint NOT NULL,
  authorized_at    timestamptz NOT NULL DEFAULT now(),
  voided_at        timestamptz,
  captured_at      timestamptz,
  charge_id        text
);
