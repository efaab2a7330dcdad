-- Each consumer deletes its own inbox claims once they are older than its
-- retention (consumer.Config.KeepClaims), every minute: this index lets that
-- statement read only the claims it deletes. Building it blocks inbox
-- inserts, so every consumer, while it runs; on a large inbox, build it
-- beforehand with
--   CREATE INDEX CONCURRENTLY saga_inbox_by_age ON saga_inbox (consumer, received_at);
-- and this migration finds it there.
CREATE INDEX IF NOT EXISTS saga_inbox_by_age ON saga_inbox (consumer, received_at);
