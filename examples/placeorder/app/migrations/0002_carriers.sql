-- shipping: the countries a carrier serves. Booking a shipment to any other
-- country is refused as a permanent error (the command is parked at once): an
-- operator adds the carrier's country here, then replays the parked command.
CREATE TABLE shipping_carriers (
  country text PRIMARY KEY,
  carrier text NOT NULL
);
INSERT INTO shipping_carriers (country, carrier) VALUES
  ('AT', 'Alpenpost'), ('BE', 'Benelux Parcel'), ('DE', 'Paketdienst'), ('ES', 'Iberia Envíos'),
  ('FR', 'Colis Rapide'), ('IT', 'Pacchi Veloci'), ('NL', 'Benelux Parcel'), ('PT', 'Iberia Envíos');
