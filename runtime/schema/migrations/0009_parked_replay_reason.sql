-- Every repair records who and why. A replay writes its reason (and whether
-- it was forced past a refused saga-state check) into the saga's audit
-- trail, but some replays have no trail to write to: a parked message that
-- names no saga, or one forced through for a saga that does not exist, of
-- a type the admin server does not serve, or named by an id that is not a
-- UUID. The parked row kept only who (replayed_by); it now keeps why and
-- whether forced too, for every replay, written in the same statement that
-- marks it replayed. Rows replayed before this migration keep an empty
-- reason. Adding columns with constant defaults rewrites nothing, so this
-- takes its lock only for a moment.
ALTER TABLE saga_parked
  ADD COLUMN replay_reason text NOT NULL DEFAULT '',
  ADD COLUMN replay_forced boolean NOT NULL DEFAULT false;
