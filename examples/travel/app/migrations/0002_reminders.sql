-- notifications: the check-in reminder sent for each booked trip.
CREATE TABLE checkin_reminders (
  trip_id      text PRIMARY KEY,
  traveller_id text NOT NULL,
  flight       text NOT NULL,
  sent_at      timestamptz NOT NULL DEFAULT now()
);
