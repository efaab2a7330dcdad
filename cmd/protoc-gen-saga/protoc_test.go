package main_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlainProtoc runs the built plugin under a real protoc (Debian's
// protobuf-compiler, 3.21: proto2/proto3, no editions) over the Place Order
// contract with module=, and requires every file it writes to equal the
// committed one — the same bytes buf generate and the in-process regen
// produce. Outside CI a missing protoc skips with the install command; under
// CI=true it fails (make test installs it).
func TestPlainProtoc(t *testing.T) {
	t.Parallel()
	protocBin, err := exec.LookPath("protoc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("protoc is not installed: make test installs it (scripts/ensure-tools.sh)")
		}
		t.Skip("protoc is not installed: apt-get install -y protobuf-compiler")
	}
	plugin := build(t)
	out := t.TempDir()
	root := filepath.Join(repoRoot, "examples", "placeorder")
	matches, err := filepath.Glob(filepath.Join(root, "shop", "*", "v1", "*.proto"))
	require.NoError(t, err)
	require.NotEmpty(t, matches)
	args := []string{
		"-I", filepath.Join(repoRoot, "options"), "-I", root,
		"--plugin=protoc-gen-saga=" + plugin,
		"--saga_out=" + out, "--saga_opt=module=github.com/protosaga/saga",
	}
	for _, m := range matches {
		rel, err := filepath.Rel(root, m)
		require.NoError(t, err)
		args = append(args, rel)
	}
	cmd := exec.Command(protocBin, args...)
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", msg)

	var files int
	require.NoError(t, filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(out, path)
		require.NoError(t, err)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		want, err := os.ReadFile(filepath.Join(repoRoot, rel))
		require.NoError(t, err, "protoc wrote %s, which is not committed", rel)
		require.Equal(t, string(want), string(got), "%s differs under plain protoc", rel)
		files++
		return nil
	}))
	require.Greater(t, files, 10, "the plugin wrote the saga artifacts")
}
