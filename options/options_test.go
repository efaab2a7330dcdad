package options_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/options"
)

// TestFilesAreTheSource: the embedded options are the files of this
// directory, not a copy that could drift.
func TestFilesAreTheSource(t *testing.T) {
	t.Parallel()
	got := options.Files()
	require.Equal(t, []string{"saga/v1/saga.proto"}, keys(got))
	want, err := os.ReadFile(filepath.Join("saga", "v1", "saga.proto"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got["saga/v1/saga.proto"]))
}

func TestExport(t *testing.T) {
	t.Parallel()
	want := options.Files()["saga/v1/saga.proto"]

	t.Run("creates, then leaves alone", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "third_party", "protosaga")
		target := filepath.Join(dir, "saga", "v1", "saga.proto")

		got, err := options.Export(dir, false)
		require.NoError(t, err)
		require.Equal(t, []options.Written{{Path: target, Outcome: options.Created}}, got)
		requireFile(t, target, want)
		requireOnly(t, dir, "saga/v1/saga.proto")

		got, err = options.Export(dir, false)
		require.NoError(t, err)
		require.Equal(t, []options.Written{{Path: target, Outcome: options.Unchanged}}, got)
		requireOnly(t, dir, "saga/v1/saga.proto")
	})

	t.Run("refuses to overwrite a different file without force", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		target := filepath.Join(dir, "saga", "v1", "saga.proto")
		require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o755))
		edited := []byte("syntax = \"proto3\";\npackage saga.v1;\n")
		require.NoError(t, os.WriteFile(target, edited, 0o644))

		got, err := options.Export(dir, false)
		require.ErrorIs(t, err, options.ErrDiffers)
		require.ErrorContains(t, err, target)
		require.ErrorContains(t, err, "-force")
		require.Nil(t, got)
		requireFile(t, target, edited)

		got, err = options.Export(dir, true)
		require.NoError(t, err)
		require.Equal(t, []options.Written{{Path: target, Outcome: options.Replaced}}, got)
		requireFile(t, target, want)
		requireOnly(t, dir, "saga/v1/saga.proto")
	})

	t.Run("a directory in the way", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "saga", "v1", "saga.proto"), 0o755))
		_, err := options.Export(dir, true)
		require.ErrorContains(t, err, filepath.Join(dir, "saga", "v1", "saga.proto"))
	})

	t.Run("no directory", func(t *testing.T) {
		t.Parallel()
		_, err := options.Export("", false)
		require.ErrorContains(t, err, "no directory given")
	})
}

func requireFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
}

// requireOnly fails unless dir holds exactly the files named (slash paths):
// no temporary files are left behind.
func requireOnly(t *testing.T, dir string, want ...string) {
	t.Helper()
	var got []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		got = append(got, filepath.ToSlash(rel))
		return err
	}))
	require.Equal(t, want, got)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
