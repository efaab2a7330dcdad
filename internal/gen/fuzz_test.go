package gen_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
)

// finding is one line of a failed generation: "file:line:col: rule-id: message".
var finding = regexp.MustCompile(`^[^\s:]+\.proto:\d+:\d+: [a-z][a-z0-9-]*: \S`)

// reviewFuzz compiles src in-process (as fuzz.proto, with the saga options
// importable) and runs the plugin on it. Sources that do not compile are not
// the plugin's business and are skipped. The plugin must not panic, and
// either generates files with names and content, generates nothing (no saga
// options), or fails with findings that each carry a position and a rule id.
// It reports whether src compiled (and so reached the plugin).
func reviewFuzz(t *testing.T, src string) bool {
	if len(src) > 64<<10 {
		return false
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fuzz.proto"), []byte(src), 0o644))
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{dir, filepath.Join(repoRoot, "options")},
	}, "fuzz.proto")
	if err != nil {
		return false // not a valid proto file: protoc would refuse it before us
	}
	var warn bytes.Buffer
	resp := gen.Response(req, &warn)
	if resp.Error != nil {
		msg := strings.TrimSpace(resp.GetError())
		require.NotEmpty(t, msg, "an empty error")
		for _, line := range strings.Split(msg, "\n") {
			require.Regexp(t, finding, line, "a finding without position or rule id:\n%s\nin:\n%s", line, src)
		}
		require.Empty(t, resp.File, "files generated next to an error")
		return true
	}
	for _, f := range resp.File {
		require.NotEmpty(t, f.GetName(), "a generated file without a name")
		require.NotEmpty(t, f.GetContent(), "generated file %s is empty", f.GetName())
	}
	for _, line := range strings.Split(strings.TrimSpace(warn.String()), "\n") {
		if line != "" {
			require.Regexp(t, regexp.MustCompile(`\.proto:\d+:\d+: `), line, "a warning without position")
		}
	}
	return true
}

// FuzzReviewSource mutates whole contract files, seeded with every
// design-review case and the examples' contracts: option parsing and the
// design review never panic and always answer with files or positioned
// findings.
func FuzzReviewSource(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join(repoRoot, "testdata", "review", "*.proto"))
	require.NoError(f, err)
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		// The seeds import only saga.proto; cases that span files are
		// fuzzed as their main file, which may then fail to compile.
		f.Add(strings.ReplaceAll(string(b), "package review.", "package fuzz."))
	}
	f.Fuzz(func(t *testing.T, src string) { reviewFuzz(t, src) })
}

// FuzzReviewOptions fills the option values of a complete saga contract
// with arbitrary text and numbers (durations, field paths, routing keys,
// enum numbers, message references, budgets), so that nearly every input
// compiles and reaches option parsing and the design review.
func FuzzReviewOptions(f *testing.F) {
	f.Add("id", "command.fuzz.reserve", "10s", "Reserve", "Reserved", "Release", int32(1), int32(2), int32(3), int32(2), uint32(3), "1h")
	f.Add("id", "command.fuzz.reserve", "10s", "Reserve", "Reserved", "Release", int32(1), int32(2), int32(3), int32(1), uint32(3), "1h")
	f.Add("", "", "", "", "", "", int32(0), int32(0), int32(0), int32(0), uint32(0), "")
	f.Add("order.id", "a..b", "-5s", "Nope", "Start", "Reserve", int32(3), int32(9), int32(-1), int32(2), uint32(1<<31), "0s")
	f.Add("items", "#", "1ms", "fuzz.Reserve", "Released", "", int32(2), int32(1), int32(2), int32(3), uint32(100), "99999999h")
	f.Add("id\x00", "command.fuzz.reserve", "1.5h", "Release", "Reserved", "Release", int32(1), int32(1), int32(1), int32(1), uint32(1), "x")
	f.Fuzz(func(t *testing.T, key, routing, timeout, command, success, compensation string,
		role, onTimeout, late, role2 int32, attempts uint32, deadline string,
	) {
		reviewFuzz(t, optionsContract(key, routing, timeout, command, success, compensation, role, onTimeout, late, role2, attempts, deadline))
	})
}

// optionsContract is FuzzReviewOptions' contract with the given option values.
func optionsContract(key, routing, timeout, command, success, compensation string,
	role, onTimeout, late, role2 int32, attempts uint32, deadline string,
) string {
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	return fmt.Sprintf(`syntax = "proto3";
package fuzz;
import "saga/v1/saga.proto";
option go_package = "example.com/fuzz;fuzz";
message Start {
  option (saga.v1.message) = {kind: KIND_COMMAND, idempotency_key: [%[1]s], correlation_field: "id"};
  string id = 1;
}
message Reserve {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", routing_key: %[2]s, idempotency_key: [%[1]s], correlation_field: "id"};
  string id = 1;
  repeated string items = 2;
}
message Reserved {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: %[1]s};
  string id = 1;
}
message Release {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", idempotency_key: ["id"], correlation_field: "id"};
  string id = 1;
}
message Released {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "id"};
  string id = 1;
}
message Charge {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "pay", idempotency_key: ["id"], correlation_field: "id"};
  string id = 1;
}
message Charged {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "id"};
  string id = 1;
}
message OrderData {
  option (saga.v1.saga) = {
    start: "Start"
    business_key: %[1]s
    deadline: %[12]s
    steps: {
      name: "Reserve"
      role: %[7]d
      command: %[4]s
      success: %[5]s
      compensation: %[6]s
      compensation_reply: "Released"
      timeout: %[3]s
      on_timeout: %[8]d
      max_attempts: %[11]d
      late_reply: %[9]d
    }
    steps: {
      name: "Charge"
      role: %[10]d
      command: "Charge"
      success: "Charged"
      timeout: %[3]s
      on_timeout: %[8]d
      max_attempts: %[11]d
      late_reply: %[9]d
    }
  };
  string id = 1;
}
`, q(key), q(routing), q(timeout), q(command), q(success), q(compensation), role, onTimeout, late, role2, attempts, q(deadline))
}

// TestFuzzTemplateReachesThePlugin guards the fuzz harness: the options
// template's good values compile and generate code, and a bad value fails
// with a positioned finding, so FuzzReviewOptions exercises option parsing
// and the review rather than the proto compiler.
func TestFuzzTemplateReachesThePlugin(t *testing.T) {
	t.Parallel()
	good := optionsContract("id", "command.fuzz.reserve", "10s", "Reserve", "Reserved", "Release", 1, 2, 3, 2, 3, "1h")
	require.True(t, reviewFuzz(t, good))
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fuzz.proto"), []byte(good), 0o644))
	req, err := protoc.Request(context.Background(), protoc.Options{ImportPaths: []string{dir, filepath.Join(repoRoot, "options")}}, "fuzz.proto")
	require.NoError(t, err)
	resp := gen.Response(req, &bytes.Buffer{})
	require.Empty(t, resp.GetError())
	require.NotEmpty(t, resp.File)

	bad := optionsContract("nope", "command.fuzz.reserve", "10s", "Reserve", "Reserved", "Release", 1, 2, 3, 2, 3, "1h")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fuzz.proto"), []byte(bad), 0o644))
	req, err = protoc.Request(context.Background(), protoc.Options{ImportPaths: []string{dir, filepath.Join(repoRoot, "options")}}, "fuzz.proto")
	require.NoError(t, err)
	resp = gen.Response(req, &bytes.Buffer{})
	require.Regexp(t, finding, resp.GetError())
}
