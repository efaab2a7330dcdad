-- The travel example services' own tables. In production each service owns
-- its database; the example keeps them in one, next to the saga tables.

-- travellers: who may book. A traveller not listed may book too (a new
-- profile); a listed one is refused when blocked.
CREATE TABLE traveller_profiles (
  traveller_id text PRIMARY KEY,
  blocked      boolean NOT NULL DEFAULT false
);

-- flights, hotels, cars: what each flight, hotel and rental station has
-- left, keyed "<kind>:<name>" (kind flight, hotel or car).
CREATE TABLE travel_inventory (
  resource  text PRIMARY KEY,
  available integer NOT NULL CHECK (available >= 0)
);

-- One row per trip and kind while a unit is held; cancelled_at marks its
-- return.
CREATE TABLE travel_holds (
  trip_id      text NOT NULL,
  kind         text NOT NULL CHECK (kind IN ('flight', 'hotel', 'car')),
  resource     text NOT NULL,
  hold_id      text NOT NULL,
  held_at      timestamptz NOT NULL DEFAULT now(),
  cancelled_at timestamptz,
  PRIMARY KEY (trip_id, kind)
);

-- insurance: one policy per trip.
CREATE TABLE insurance_policies (
  trip_id      text PRIMARY KEY,
  policy_id    text NOT NULL,
  issued_at    timestamptz NOT NULL DEFAULT now(),
  cancelled_at timestamptz
);

-- trip: booked trips.
CREATE TABLE trip_bookings (
  trip_id      text PRIMARY KEY,
  traveller_id text NOT NULL,
  booked_at    timestamptz NOT NULL DEFAULT now()
);

-- itinerary: the itinerary sent for each booked trip.
CREATE TABLE itinerary_sent (
  trip_id      text PRIMARY KEY,
  traveller_id text NOT NULL,
  body         text NOT NULL,
  sent_at      timestamptz NOT NULL DEFAULT now()
);

-- Every business effect of every service, in order: what the example's
-- tests and the chaos soak count (each effect once per trip).
CREATE TABLE travel_ledger (
  id      bigserial PRIMARY KEY,
  trip_id text NOT NULL,
  service text NOT NULL,
  effect  text NOT NULL,
  detail  text NOT NULL DEFAULT '',
  at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX travel_ledger_trip ON travel_ledger (trip_id);
