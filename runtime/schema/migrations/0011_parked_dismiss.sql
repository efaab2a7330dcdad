-- A parked copy that no longer applies (its saga resent the command since,
-- moved past its step, or ended) can be dismissed by an operator: closed
-- without being replayed, with who, when and why. An open parked row is one
-- neither replayed nor dismissed; the parked gauge, parking's check for an
-- open row of the same message and queue, and the admin API's lists read
-- both columns. Adding nullable columns and columns with constant defaults
-- rewrites nothing.
ALTER TABLE saga_parked
  ADD COLUMN dismissed_at timestamptz,
  ADD COLUMN dismissed_by text NOT NULL DEFAULT '',
  ADD COLUMN dismiss_reason text NOT NULL DEFAULT '';

-- A message parked without saga metadata (an event published without a
-- saga id, which its saga's consumer finds by the message's correlation
-- field) keeps that field's value, the saga's business key (or id), so
-- that the admin API joins it to its saga: correlation_key, set by parking
-- when the message names no saga and decodes. Rows parked before keep ''
-- (the admin API reads their bodies).
ALTER TABLE saga_parked ADD COLUMN correlation_key text NOT NULL DEFAULT '';
CREATE INDEX saga_parked_unlinked ON saga_parked (correlation_key) WHERE saga_id = '' AND correlation_key <> '';

-- The admin API's log of operator actions across sagas reads the audit rows
-- an operator wrote, newest first.
CREATE INDEX saga_audit_operator ON saga_audit (id) WHERE operator <> '';
