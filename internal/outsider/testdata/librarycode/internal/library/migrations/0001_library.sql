-- The library's own tables.
CREATE TABLE library_copies (
  copy_id text PRIMARY KEY,
  isbn    text NOT NULL,
  held_by text -- the loan holding the copy
);

-- Every effect of the library's services, appended in the effect's
-- transaction.
CREATE TABLE library_ledger (
  id      bigserial PRIMARY KEY,
  loan_id text NOT NULL,
  effect  text NOT NULL
);
