package testenv

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/sagadef"
)

// CreateSagaTable creates the instance table of a compiled definition, as
// the generator's migrations lay it out (docs/architecture.md), for runtime
// tests that use hand-built definitions instead of generated code.
func CreateSagaTable(t testing.TB, pool *pgxpool.Pool, def *sagadef.Definition) {
	t.Helper()
	states := make([]string, 0, len(def.States))
	for _, s := range def.States {
		states = append(states, "'"+s.Name+"'")
	}
	if len(states) == 0 {
		t.Fatalf("testenv: create saga table %s: the definition is not compiled (no states)", def.Table)
	}
	table := pgx.Identifier{def.Table}.Sanitize()
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (
  id            uuid PRIMARY KEY,
  business_key  text NOT NULL UNIQUE,
  state         text NOT NULL CHECK (state IN (`+strings.Join(states, ", ")+`)),
  version       bigint NOT NULL DEFAULT 1,
  data          bytea NOT NULL,
  attempt       integer NOT NULL DEFAULT 0,
  pending_message_id uuid,
  progress      jsonb NOT NULL DEFAULT '{}',
  timeout_at    timestamptz,
  deadline_at   timestamptz,
  last_error    text,
  review_reason text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON `+table+` (state);
CREATE INDEX ON `+table+` (timeout_at) WHERE timeout_at IS NOT NULL;
CREATE INDEX ON `+table+` (updated_at);`)
	if err != nil {
		t.Fatalf("testenv: create saga table %s: %v", def.Table, err)
	}
}
