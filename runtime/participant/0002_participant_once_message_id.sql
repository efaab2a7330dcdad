-- The message id a command ran as: a redelivery of that message (a lost
-- acknowledgement) has no effect and sends no reply, so the participant's
-- consumer needs no inbox claim. Empty for a record a compensation wrote
-- before its command ran.
ALTER TABLE saga_participant_once ADD COLUMN message_id text NOT NULL DEFAULT '';
