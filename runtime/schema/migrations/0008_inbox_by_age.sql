-- Each consumer deletes its own inbox claims once they are older than its
-- retention (consumer.Config.KeepClaims), every minute: this index lets that
-- statement read only the claims it deletes. Building it blocks inbox
-- inserts, so every consumer, while it runs; on a large inbox, build it
-- beforehand with
--   CREATE INDEX CONCURRENTLY saga_inbox_by_age ON saga_inbox (consumer, received_at);
-- and this migration finds it there. A concurrent build that failed or was
-- cancelled leaves an invalid index behind, which PostgreSQL never uses:
-- that one is dropped and built again here.
DO $$
BEGIN
  IF EXISTS (
    SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relname = 'saga_inbox_by_age' AND c.relnamespace = current_schema()::regnamespace
      AND NOT i.indisvalid
  ) THEN
    DROP INDEX saga_inbox_by_age;
  END IF;
END $$;
CREATE INDEX IF NOT EXISTS saga_inbox_by_age ON saga_inbox (consumer, received_at);
