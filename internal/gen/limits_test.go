package gen_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen/protoc"
	"github.com/protosaga/saga/internal/testenv"
)

// TestTableIdentifiersFit generates a saga whose instance table name is as
// long as the name-length rule allows and applies its migrations to
// PostgreSQL: the identifiers they declare from the table name (indexes, a
// constraint), cut to 63 bytes as PostgreSQL cuts them, must stay distinct,
// and the migrations must run twice over (the states migration drops and
// adds its constraint by name). One byte more is refused.
func TestTableIdentifiersFit(t *testing.T) {
	t.Parallel()
	const maxPG = 63
	longest := maxPG - len("_state") - 1 // one byte more, "<table>_state_check" is cut to "<table>_state"
	contract := func(name string) string {
		return `syntax = "proto3";
package fit.v1;
import "saga/v1/saga.proto";
option go_package = "example.com/fit/v1;fitv1";
` + events("Placed", "Approved") + `
message FitData {
  option (saga.v1.saga) = {name: "` + name + `", service: "fit", start: "Placed", business_key: "id", steps: {role: ROLE_PIVOT, external: true, success: "Approved", timeout: "1h", late_reply: LATE_REPLY_MANUAL_REVIEW}};
  string id = 1;
}
`
	}
	generate := func(name string) (string, map[string][]byte) {
		root := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(root, "fit", "v1"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "fit", "v1", "fit.proto"), []byte(contract(name)), 0o644))
		got, resp := outcome(compile(t, root, "paths=source_relative", "fit/v1/fit.proto"))
		return got, protoc.Files(resp)
	}

	name := "F" + strings.Repeat("x", longest-len("saga_")-1)
	table := "saga_" + strings.ToLower(name)
	require.Len(t, table, longest)
	got, files := generate(name)
	require.Empty(t, got)
	ident := regexp.MustCompile(`\b` + table + `\w*`)
	cut := map[string]string{} // identifier as PostgreSQL keeps it -> as declared
	var paths []string
	for path, b := range files {
		if !strings.HasSuffix(path, ".sql") {
			continue
		}
		paths = append(paths, path)
		for _, id := range ident.FindAllString(string(b), -1) {
			kept := id[:min(len(id), maxPG)]
			if other, ok := cut[kept]; ok {
				require.Equal(t, other, id, "%s and %s are one name to PostgreSQL", other, id)
			}
			cut[kept] = id
		}
	}
	require.Len(t, paths, 3)
	require.Len(t, cut, 7, "the table and its six declared identifiers: %v", cut)

	slices.Sort(paths) // the create migration, the states migration, the indexes
	ctx := context.Background()
	pool := testenv.Postgres(t)
	for range 2 {
		for _, path := range paths {
			_, err := pool.Exec(ctx, string(files[path]))
			if err != nil && strings.Contains(path, "create") {
				continue // applied once only: its CREATE TABLE runs again below
			}
			require.NoError(t, err, "%s", path)
		}
	}
	var indexes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1`, table).Scan(&indexes))
	require.Equal(t, 5, indexes, "primary key, business key and the three declared indexes")

	got, _ = generate(name + "x")
	require.Contains(t, got, "name-length: saga fit.v1."+name+"x: table name "+table+"x (57 bytes) is too long")
}
