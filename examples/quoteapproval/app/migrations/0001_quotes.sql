-- The example services' own tables. In production each service owns its
-- database; the example keeps them in one, next to the saga tables.

-- pricing: the price each published price version sets for a quote.
CREATE TABLE pricing_price_versions (
  price_version bigint PRIMARY KEY,
  currency      text NOT NULL,
  minor_units   bigint NOT NULL CHECK (minor_units > 0)
);

-- pricing: the price held for each quote; released_at marks its release.
CREATE TABLE pricing_holds (
  quote_id      text PRIMARY KEY,
  price_version bigint NOT NULL,
  currency      text NOT NULL,
  minor_units   bigint NOT NULL,
  held_at       timestamptz NOT NULL DEFAULT now(),
  released_at   timestamptz
);

-- approval: one decision per quote, by a person.
CREATE TABLE approval_decisions (
  quote_id       text PRIMARY KEY,
  approved       boolean NOT NULL,
  approver_email text NOT NULL,
  note           text NOT NULL DEFAULT '',
  decided_at     timestamptz NOT NULL DEFAULT now()
);

-- ordering: the order an approved quote became.
CREATE TABLE ordering_orders (
  order_id     text PRIMARY KEY,
  quote_id     text NOT NULL UNIQUE,
  customer_id  text NOT NULL,
  currency     text NOT NULL,
  minor_units  bigint NOT NULL,
  submitted_at timestamptz NOT NULL DEFAULT now()
);

-- Every business effect (and business refusal) of every service, written in
-- the effect's transaction; ids order the effects of one quote.
CREATE TABLE quote_ledger (
  id       bigserial PRIMARY KEY,
  quote_id text NOT NULL,
  service  text NOT NULL,
  effect   text NOT NULL,
  detail   text NOT NULL DEFAULT '',
  at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quote_ledger_quote ON quote_ledger (quote_id, id);
