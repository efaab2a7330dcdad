package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExportMigrationsCommand writes the runtime's, participant's and a
// source's migrations into a goose directory after the team's own, checks
// it, and checks it again once the source gained a file.
func TestExportMigrationsCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	none := func(string) string { return "" }
	src, dir := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "0001_orders.sql"), []byte("CREATE TABLE saga_orders (id uuid PRIMARY KEY);\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00007_accounts.sql"), []byte("-- +goose Up\nCREATE TABLE accounts (id bigint);\n"), 0o600))
	runtimeFiles, err := filepath.Glob("../../runtime/schema/migrations/*.sql")
	require.NoError(t, err)
	args := []string{"export-migrations", "-dir", dir, "-format", "goose", "-participant", "-source", "saga_orders=" + src}

	var out, errOut bytes.Buffer
	require.Equal(t, 1, run(ctx, append(args, "-check"), &out, &errOut, none))
	require.Contains(t, out.String(), "not exported: runtime/0001_runtime_tables.sql\n")
	require.Contains(t, errOut.String(), "are not exported to "+dir)
	require.Len(t, dirEntries(t, dir), 1, "-check writes nothing")

	out.Reset()
	require.Equal(t, 0, run(ctx, args, &out, &errOut, none), errOut.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, len(runtimeFiles)+3)
	require.Equal(t, "wrote "+filepath.Join(dir, "00008_saga_runtime_0001_runtime_tables.sql"), lines[0])
	next := 8 + len(runtimeFiles) // after the runtime's, numbered from the highest version there (7)
	require.Equal(t, "wrote "+filepath.Join(dir, fmt.Sprintf("%05d_participant_0001_participant_once.sql", next)), lines[len(lines)-3])
	require.Equal(t, "wrote "+filepath.Join(dir, fmt.Sprintf("%05d_participant_0002_participant_once_message_id.sql", next+1)), lines[len(lines)-2])
	require.Equal(t, "wrote "+filepath.Join(dir, fmt.Sprintf("%05d_saga_orders_0001_orders.sql", next+2)), lines[len(lines)-1])
	require.Len(t, dirEntries(t, dir), len(runtimeFiles)+4)

	out.Reset()
	require.Equal(t, 0, run(ctx, append(args, "-check"), &out, &errOut, none), errOut.String())
	require.Equal(t, dir+" is up to date\n", out.String())

	require.NoError(t, os.WriteFile(filepath.Join(src, "0002_orders_index.sql"), []byte("CREATE INDEX ON saga_orders (id);\n"), 0o600))
	out.Reset()
	errOut.Reset()
	require.Equal(t, 1, run(ctx, append(args, "-check"), &out, &errOut, none))
	require.Equal(t, "not exported: saga_orders/0002_orders_index.sql\n", out.String())
	out.Reset()
	require.Equal(t, 0, run(ctx, args, &out, &errOut, none), errOut.String())
	require.Equal(t, "wrote "+filepath.Join(dir, fmt.Sprintf("%05d_saga_orders_0002_orders_index.sql", next+3))+"\n", out.String())
}

func TestExportMigrationsCommandErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	none := func(string) string { return "" }
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"-format", "goose"}, 2, "-dir is required"},
		{[]string{"-dir", dir}, 2, "-format must be goose or golang-migrate"},
		{[]string{"-dir", dir, "-format", "flyway"}, 2, "-format must be goose or golang-migrate"},
		{[]string{"-dir", dir, "-format", "goose", "extra"}, 2, `unexpected arguments ["extra"]`},
		{[]string{"-dir", dir, "-format", "goose", "-source", "x"}, 2, "want NAME=DIR"},
		{[]string{"-dir", filepath.Join(dir, "missing"), "-format", "goose"}, 1, "no such file or directory"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, tc.code, run(ctx, append([]string{"export-migrations"}, tc.args...), &out, &errOut, none), "%q: %s", tc.args, errOut.String())
		require.Contains(t, errOut.String(), tc.err, tc.args)
	}
	require.Empty(t, dirEntries(t, dir))
}

func dirEntries(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	return entries
}
