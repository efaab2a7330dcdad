package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/internal/gen/model"
	"github.com/protosaga/saga/internal/gen/text"
	"github.com/protosaga/saga/runtime/sagadef"
)

// CreateSagaTable creates the instance table of a compiled definition by
// applying, in order, the migrations the generator renders for it, for
// runtime tests that use hand-built definitions instead of generated code.
func CreateSagaTable(t testing.TB, pool *pgxpool.Pool, def *sagadef.Definition) {
	t.Helper()
	if len(def.States) == 0 {
		t.Fatalf("testenv: create saga table %s: the definition is not compiled (no states)", def.Table)
	}
	r, err := text.New()
	if err != nil {
		t.Fatalf("testenv: create saga table %s: %v", def.Table, err)
	}
	files, err := r.Migrations(&model.Saga{FullName: def.Name, Table: def.Table, Definition: def})
	if err != nil {
		t.Fatalf("testenv: create saga table %s: %v", def.Table, err)
	}
	for _, f := range files {
		if _, err := pool.Exec(context.Background(), string(f.Content)); err != nil {
			t.Fatalf("testenv: create saga table %s: apply %s: %v", def.Table, f.Name, err)
		}
	}
}
