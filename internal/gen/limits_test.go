package gen_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen/protoc"
)

// TestTableIdentifiersFit generates a saga whose instance table name is as
// long as the name-length rule allows and requires every identifier its
// migrations declare from the table name (indexes, constraints) to fit
// PostgreSQL's 63 bytes, with room for the ones PostgreSQL derives itself
// (<table>_business_key_key, <table>_pkey). One byte more is refused.
func TestTableIdentifiersFit(t *testing.T) {
	t.Parallel()
	const maxPG = 63
	implicit := len("_business_key_key") // the longest name PostgreSQL derives
	longest := maxPG - implicit          // "saga_" + snake_case name
	contract := func(name string) string {
		return `syntax = "proto3";
package fit.v1;
import "saga/v1/saga.proto";
option go_package = "example.com/fit/v1;fitv1";
` + events("Placed", "Approved") + `
message FitData {
  option (saga.v1.saga) = {name: "` + name + `", service: "fit", start: "Placed", business_key: "id", steps: {role: ROLE_PIVOT, external: true, success: "Approved", timeout: "1h", late_reply: LATE_REPLY_IGNORE}};
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
	var sql int
	for path, b := range files {
		if !strings.HasSuffix(path, ".sql") {
			continue
		}
		sql++
		for _, id := range ident.FindAllString(string(b), -1) {
			require.LessOrEqual(t, len(id), maxPG, "%s declares %s", path, id)
		}
	}
	require.Equal(t, 2, sql)

	got, _ = generate(name + "x")
	require.Contains(t, got, "name-length: saga fit.v1."+name+"x: table name "+table+"x (47 bytes) is too long")
}
