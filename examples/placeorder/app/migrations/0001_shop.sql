-- The example services' own tables. In production each service owns its
-- database; the example keeps them in one, next to the saga tables.

-- inventory: stock on hand and what each order holds.
CREATE TABLE inventory_stock (
  product_id text PRIMARY KEY,
  available  integer NOT NULL CHECK (available >= 0)
);

-- One row per order and product while stock is held; released_at marks a
-- release. A release that finds nothing leaves a tombstone (product_id ''),
-- so a reservation arriving after its own compensation is refused.
CREATE TABLE inventory_reservations (
  order_id    text NOT NULL,
  product_id  text NOT NULL,
  quantity    integer NOT NULL,
  reserved_at timestamptz NOT NULL DEFAULT now(),
  released_at timestamptz,
  PRIMARY KEY (order_id, product_id)
);

-- payment: one authorization per order.
CREATE TABLE payment_authorizations (
  order_id         text PRIMARY KEY,
  authorization_id text NOT NULL,
  currency         text NOT NULL,
  minor_units      bigint NOT NULL,
  authorized_at    timestamptz NOT NULL DEFAULT now()
);

-- shipping: one shipment per order.
CREATE TABLE shipping_shipments (
  order_id    text PRIMARY KEY,
  tracking_id text NOT NULL,
  booked_at   timestamptz NOT NULL DEFAULT now()
);

-- order: approved orders.
CREATE TABLE order_approvals (
  order_id    text PRIMARY KEY,
  approved_at timestamptz NOT NULL DEFAULT now()
);

-- Every business effect (and business refusal) of every service, written in
-- the effect's transaction. The effects of one order are causally ordered (a
-- step's command is sent only after the previous step committed), so their ids
-- order them: the end-to-end test reads this journal to prove that no effect
-- happened twice and that compensations ran in reverse order.
CREATE TABLE shop_ledger (
  id       bigserial PRIMARY KEY,
  order_id text NOT NULL,
  service  text NOT NULL,
  effect   text NOT NULL,
  detail   text NOT NULL DEFAULT '',
  at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shop_ledger_order ON shop_ledger (order_id, id);
