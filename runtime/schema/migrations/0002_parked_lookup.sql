-- Parking checks whether a redelivered message already has an open parked row
-- (message_id, queue); operators list open parked messages. Both read this index.
CREATE INDEX saga_parked_open ON saga_parked (message_id, queue) WHERE replayed_at IS NULL;
