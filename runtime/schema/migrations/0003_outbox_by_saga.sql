-- Operators read a saga's timeline: the messages it sent, by saga id.
CREATE INDEX saga_outbox_saga ON saga_outbox (saga_id) WHERE saga_id <> '';
