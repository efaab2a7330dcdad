-- Outbox rows are updated twice after their insert: the relay's lease, then
-- published_at. Free space on each page lets the lease update (which changes
-- no indexed column) stay on the page as a HOT update, without new index
-- entries.
ALTER TABLE saga_outbox SET (fillfactor = 60);
