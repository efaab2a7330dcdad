package main_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
)

const repoRoot = "../.."

// build compiles the plugin binary once per test.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "protoc-gen-saga")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func request(t *testing.T, root, param string, files ...string) *pluginpb.CodeGeneratorRequest {
	t.Helper()
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{filepath.Join(repoRoot, root), filepath.Join(repoRoot, "options")},
		Parameter:   param,
	}, files...)
	require.NoError(t, err)
	return req
}

func run(t *testing.T, bin string, req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, string) {
	t.Helper()
	in, err := proto.Marshal(req)
	require.NoError(t, err)
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())
	resp := &pluginpb.CodeGeneratorResponse{}
	require.NoError(t, proto.Unmarshal(stdout.Bytes(), resp))
	return resp, stderr.String()
}

// TestBinary runs the built plugin the way protoc and buf do: a
// CodeGeneratorRequest on stdin, a response on stdout.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := build(t)

	out, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	require.Equal(t, "protoc-gen-saga devel\n", string(out))

	t.Run("examples", func(t *testing.T) {
		t.Parallel()
		req := request(t, "examples/placeorder", "paths=source_relative",
			"shop/order/v1/order.proto", "shop/inventory/v1/inventory.proto")
		resp, stderr := run(t, bin, req)
		require.Empty(t, resp.GetError())
		require.Empty(t, stderr)
		want := gen.Response(req, io.Discard)
		require.True(t, proto.Equal(want, resp), "binary and in-process output differ")
		require.NotZero(t, resp.GetSupportedFeatures()&uint64(pluginpb.CodeGeneratorResponse_FEATURE_SUPPORTS_EDITIONS))
		require.Equal(t, int32(descriptorpb.Edition_EDITION_2023), resp.GetMaximumEdition())
	})

	t.Run("review failure", func(t *testing.T) {
		t.Parallel()
		resp, _ := run(t, bin, request(t, "testdata/review", "", "step_timeout_late.proto"))
		require.Empty(t, resp.File)
		require.True(t, strings.HasPrefix(resp.GetError(), "step_timeout_late.proto:51:5: step-late-reply: "), resp.GetError())
	})

	t.Run("missing go_package", func(t *testing.T) {
		t.Parallel()
		req := request(t, "testdata/review", "", "go_package.proto")
		resp, _ := run(t, bin, req)
		require.Empty(t, resp.File)
		require.True(t, strings.HasPrefix(resp.GetError(), "go_package.proto:5:1: go-package: "), resp.GetError())
		req = request(t, "testdata/review", "Mgo_package.proto=example.com/review/gopackage;gopackage", "go_package.proto")
		resp, _ = run(t, bin, req)
		require.Empty(t, resp.GetError(), "an M parameter gives the file its import path")
		require.NotEmpty(t, resp.File)
	})

	t.Run("not a request", func(t *testing.T) {
		t.Parallel()
		cmd := exec.Command(bin)
		cmd.Stdin = strings.NewReader("this is not a CodeGeneratorRequest")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		require.Error(t, err)
		require.Empty(t, stdout.String())
		require.Contains(t, stderr.String(), "decode the code generator request")
	})

	t.Run("warnings on stderr", func(t *testing.T) {
		t.Parallel()
		resp, stderr := run(t, bin, request(t, "testdata/review", "", "reply_unused.proto"))
		require.Empty(t, resp.GetError())
		require.Contains(t, stderr, "reply_unused.proto:15:3: reply-unused: warning: ")
		resp, _ = run(t, bin, request(t, "testdata/review", "warnings=error", "reply_unused.proto"))
		require.Contains(t, resp.GetError(), "reply_unused.proto:15:3: reply-unused: ")
		require.Empty(t, resp.File)
	})
}

// TestExportOptions runs `protoc-gen-saga export-options` as a user does: it
// writes the options the binary embeds, leaves an identical file alone,
// refuses to replace a different one without -force.
func TestExportOptions(t *testing.T) {
	t.Parallel()
	bin := build(t)
	want, err := os.ReadFile(filepath.Join(repoRoot, "options", "saga", "v1", "saga.proto"))
	require.NoError(t, err)
	dir := t.TempDir()
	target := filepath.Join(dir, "third_party", "protosaga", "saga", "v1", "saga.proto")

	export := func(args ...string) (stdout, stderr string, err error) {
		cmd := exec.Command(bin, append([]string{"export-options"}, args...)...)
		cmd.Dir = dir
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}

	stdout, stderr, err := export("third_party/protosaga")
	require.NoError(t, err, stderr)
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: created\n", stdout)
	require.Empty(t, stderr)
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "the binary exports options/saga/v1/saga.proto")

	stdout, _, err = export("third_party/protosaga")
	require.NoError(t, err)
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: unchanged\n", stdout)

	require.NoError(t, os.WriteFile(target, []byte("// edited\n"), 0o644))
	stdout, stderr, err = export("third_party/protosaga")
	require.Error(t, err)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "protoc-gen-saga export-options: export the saga.v1 options into third_party/protosaga: "+
		"third_party/protosaga/saga/v1/saga.proto differs from the saga.v1 options of this protoc-gen-saga")
	require.Contains(t, stderr, "rerun with -force")
	got, err = os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, "// edited\n", string(got), "nothing is replaced without -force")

	stdout, _, err = export("-force", "third_party/protosaga")
	require.NoError(t, err)
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: replaced\n", stdout)
	got, err = os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
	require.NoError(t, os.WriteFile(target, []byte("// edited\n"), 0o644))
	stdout, _, err = export("third_party/protosaga", "-force")
	require.NoError(t, err, "-force after the directory too")
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: replaced\n", stdout)

	_, stderr, err = export()
	require.Error(t, err)
	require.Contains(t, stderr, "usage: protoc-gen-saga export-options [-force] DIR")
	require.Contains(t, stderr, "want exactly one directory")

	stdout, stderr, err = export("-h")
	require.NoError(t, err, "help is not an error")
	require.Empty(t, stdout)
	require.Contains(t, stderr, "usage: protoc-gen-saga export-options [-force] DIR")
}
