package gen_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/model"
	"github.com/protosaga/saga/internal/gen/protoc"
)

var update = flag.Bool("update", false, "rewrite golden files and committed generated code")

// repoRoot is the repository root relative to this package.
const repoRoot = "../.."

func compile(t *testing.T, root string, param string, files ...string) *pluginpb.CodeGeneratorRequest {
	t.Helper()
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{root, filepath.Join(repoRoot, "options")},
		Parameter:   param,
	}, files...)
	require.NoError(t, err)
	return req
}

// outcome is what a review case produces: the error response, or the
// warnings of a successful run.
func outcome(req *pluginpb.CodeGeneratorRequest) (string, *pluginpb.CodeGeneratorResponse) {
	var warn bytes.Buffer
	resp := gen.Response(req, &warn)
	if resp.Error != nil {
		return resp.GetError() + "\n", resp
	}
	return warn.String(), resp
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./internal/gen -update")
	require.Equal(t, string(want), string(got), "golden %s differs; rerun with -update if intended", path)
}

// TestReview runs every design-review case in testdata/review and asserts
// the exact findings ("file:line:col: rule-id: message (hint: ...)").
func TestReview(t *testing.T) {
	t.Parallel()
	root := filepath.Join(repoRoot, "testdata", "review")
	protos, err := filepath.Glob(filepath.Join(root, "*.proto"))
	require.NoError(t, err)
	require.NotEmpty(t, protos)
	for _, p := range protos {
		name := strings.TrimSuffix(filepath.Base(p), ".proto")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A case may span files: x.proto plus every x/*.proto.
			files := []string{filepath.Base(p)}
			more, err := filepath.Glob(filepath.Join(root, name, "*.proto"))
			require.NoError(t, err)
			for _, m := range more {
				files = append(files, name+"/"+filepath.Base(m))
			}
			got, resp := outcome(compile(t, root, "", files...))
			golden(t, filepath.Join(root, name+".err"), []byte(got))
			if resp.Error != nil {
				require.Empty(t, resp.File, "nothing may be written when the review fails")
			}
		})
	}
}

// TestReviewWarningsAsErrors promotes the reply-unused warning to an error.
func TestReviewWarningsAsErrors(t *testing.T) {
	t.Parallel()
	root := filepath.Join(repoRoot, "testdata", "review")
	warned, resp := outcome(compile(t, root, "", "reply_unused.proto"))
	require.Nil(t, resp.Error)
	require.NotEmpty(t, resp.File)
	require.Contains(t, warned, "reply-unused: warning: ")

	failed, resp := outcome(compile(t, root, "warnings=error", "reply_unused.proto"))
	require.NotNil(t, resp.Error)
	require.Empty(t, resp.File)
	require.Equal(t, strings.Replace(warned, "warning: ", "", 1), failed)

	_, resp = outcome(compile(t, root, "warnings=loud", "reply_unused.proto"))
	require.Contains(t, resp.GetError(), `warnings="loud"`)
}

var ruleRE = regexp.MustCompile(`(?m)^[^:\n]+:\d+:\d+: ([a-z-]+): `)

// TestEveryRuleHasACase asserts that every rule id is exercised by a case
// and documented in docs/design-review.md.
func TestEveryRuleHasACase(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	errs, err := filepath.Glob(filepath.Join(repoRoot, "testdata", "review", "*.err"))
	require.NoError(t, err)
	for _, e := range errs {
		b, err := os.ReadFile(e)
		require.NoError(t, err)
		for _, m := range ruleRE.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "design-review.md"))
	require.NoError(t, err)
	var missing []string
	for _, r := range model.Rules {
		if !seen[r.ID] && !r.Defensive {
			missing = append(missing, r.ID+" (no case)")
		}
		if !strings.Contains(string(doc), "### `"+r.ID+"`") {
			missing = append(missing, r.ID+" (undocumented)")
		}
	}
	for id := range seen {
		if !slices.ContainsFunc(model.Rules, func(r model.Rule) bool { return r.ID == id }) {
			missing = append(missing, id+" (not in model.Rules)")
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing)
}

// TestReviewProtocPositions: plain protoc records no positions inside
// option literals; findings then point at the option statement.
func TestReviewProtocPositions(t *testing.T) {
	t.Parallel()
	root := filepath.Join(repoRoot, "testdata", "review")
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{root, filepath.Join(repoRoot, "options")},
		SourceInfo:  protocompile.SourceInfoStandard,
	}, "step_timeout_late.proto")
	require.NoError(t, err)
	got, _ := outcome(req)
	src, err := os.ReadFile(filepath.Join(root, "step_timeout_late.proto"))
	require.NoError(t, err)
	line := slices.IndexFunc(strings.Split(string(src), "\n"), func(l string) bool {
		return strings.Contains(l, "option (saga.v1.saga)")
	}) + 1
	lines := strings.Split(strings.TrimSpace(got), "\n")
	require.Len(t, lines, 5)
	for _, l := range lines {
		require.True(t, strings.HasPrefix(l, fmt.Sprintf("step_timeout_late.proto:%d:3: ", line)), l)
	}
}

// TestGoPackageFindings: every go_package or M parameter protogen cannot
// take an import path from is a go-package finding with a position, not
// protogen's "unable to determine Go import path" without one.
func TestGoPackageFindings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, goPackage, param, want string
	}{
		{"package name only", `option go_package = ";a";`, "",
			`a.proto:3:1: go-package: a.proto: go_package ";a" has no import path before ';', so its Go import path is unknown`},
		{"empty M value", "", "Ma.proto=",
			`a.proto:2:1: go-package: a.proto has no go_package option, so its Go import path is unknown`},
		{"empty M value over go_package without path", `option go_package = ";a";`, "Ma.proto=",
			`a.proto:3:1: go-package: a.proto: go_package ";a" has no import path before ';'`},
		{"package name as path", `option go_package = "a";`, "",
			`a.proto:3:1: go-package: a.proto: Go import path "a" (from go_package "a") has no '.' or '/'`},
		{"package name as M path", "", "Ma.proto=a;a",
			`a.proto:2:1: go-package: a.proto: Go import path "a" (from Ma.proto=a) has no '.' or '/'`},
		{"M path wins", `option go_package = ";a";`, "Ma.proto=example.com/a", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			src := "syntax = \"proto3\";\npackage a;\n" + tc.goPackage + "\nmessage A {}\n"
			require.NoError(t, os.WriteFile(filepath.Join(root, "a.proto"), []byte(src), 0o644))
			got, resp := outcome(compile(t, root, tc.param, "a.proto"))
			if tc.want == "" {
				require.Nil(t, resp.Error, got)
				return
			}
			require.True(t, strings.HasPrefix(got, tc.want), "got %s", got)
			require.NotContains(t, got, "unable to determine")
		})
	}
}

// TestPluginParameters: spaces around comma-separated parameters are
// ignored (for protogen's parameters and ours alike), and every parameter
// error names the plugin and the parameter.
func TestPluginParameters(t *testing.T) {
	t.Parallel()
	root := filepath.Join(repoRoot, "testdata", "review")
	for _, tc := range []struct{ param, want string }{
		{"paths=source_relative, warnings=error", "reply_unused.proto:15:3: reply-unused: reply "},
		{" warnings=error ,paths=source_relative", "reply_unused.proto:15:3: reply-unused: reply "},
		{"warnings", `protoc-gen-saga: parameter warnings="": want warnings=error (fail on design-review warnings) or warnings=warn`},
		{"warnings=", `protoc-gen-saga: parameter warnings="": want warnings=error`},
		{"warnings=loud", `protoc-gen-saga: parameter warnings="loud": want warnings=error`},
		{"warning=error", `protoc-gen-saga: unknown parameter "warning"; accepted: paths=import|source_relative, module=<prefix>, M<file>=<import path>, warnings=error|warn`},
	} {
		t.Run(tc.param, func(t *testing.T) {
			t.Parallel()
			_, resp := outcome(compile(t, root, tc.param, "reply_unused.proto"))
			require.True(t, strings.HasPrefix(resp.GetError(), tc.want), "got %q", resp.GetError())
			require.Empty(t, resp.File)
		})
	}
	warned, resp := outcome(compile(t, root, "warnings=warn, paths=source_relative", "reply_unused.proto"))
	require.Nil(t, resp.Error)
	require.Contains(t, warned, "reply-unused: warning: ")
	require.Contains(t, protoc.Files(resp), "reply_unused.saga.go", "paths=source_relative after a space applies")
}
