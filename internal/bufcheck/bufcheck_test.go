package bufcheck_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"buf.build/go/bufplugin/check"
	"buf.build/go/bufplugin/check/checktest"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/bufcheck"
	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/model"
)

var update = flag.Bool("update", false, "rewrite the breaking cases' golden files")

// repoRoot is the repository root relative to this package.
const repoRoot = "../.."

var (
	optionsDir = filepath.Join(repoRoot, "options")
	reviewDir  = filepath.Join(repoRoot, "testdata", "review")
)

func TestSpec(t *testing.T) {
	t.Parallel()
	checktest.SpecTest(t, bufcheck.Spec())
}

// TestLintRules: every design-review rule is a lint rule, warnings in their
// own category and not run by default, errors by default.
func TestLintRules(t *testing.T) {
	t.Parallel()
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	rules, err := client.ListRules(t.Context())
	require.NoError(t, err)
	byID := map[string]check.Rule{}
	for _, r := range rules {
		byID[r.ID()] = r
	}
	for _, r := range model.Rules {
		got, ok := byID[bufcheck.LintRuleID(r.ID)]
		require.True(t, ok, "review rule %s has no lint rule", r.ID)
		require.Equal(t, check.RuleTypeLint, got.Type())
		require.Len(t, got.Categories(), 1)
		want := bufcheck.CategoryLint
		if r.Warning {
			want = bufcheck.CategoryLintWarnings
		}
		require.Equal(t, want, got.Categories()[0].ID(), r.ID)
		require.Equal(t, !r.Warning, got.Default(), r.ID)
		require.NotContains(t, got.Purpose(), "Reports the design review's", "review rule %s needs a purpose in lintPurposes", r.ID)
	}
	require.Equal(t, "SAGA_COMMAND_IDEMPOTENCY", bufcheck.LintRuleID("command-idempotency"))
}

// lintRuleIDs returns every lint rule id (the default set leaves out the
// warnings).
func lintRuleIDs() []string {
	var ids []string
	for _, r := range model.Rules {
		ids = append(ids, bufcheck.LintRuleID(r.ID))
	}
	return ids
}

// reviewRule maps a lint rule id back to its design-review rule.
func reviewRule(t *testing.T, id string) model.Rule {
	t.Helper()
	for _, r := range model.Rules {
		if bufcheck.LintRuleID(r.ID) == id {
			return r
		}
	}
	t.Fatalf("lint rule %s is no design-review rule", id)
	return model.Rule{}
}

// reviewLine formats a lint annotation as protoc-gen-saga prints the
// finding: "file:line:col: rule-id: [warning: ]message (hint: ...)".
func reviewLine(t *testing.T, a check.Annotation) string {
	t.Helper()
	r := reviewRule(t, a.RuleID())
	msg := a.Message()
	if r.Warning {
		msg = "warning: " + msg
	}
	loc := a.FileLocation()
	require.NotNil(t, loc, "annotation without a location: %s", msg)
	return fmt.Sprintf("%s:%d:%d: %s: %s", loc.FileDescriptor().ProtoreflectFileDescriptor().Path(),
		loc.StartLine()+1, loc.StartColumn()+1, r.ID, msg)
}

// reviewFiles returns the files of a review case: x.proto and x/*.proto.
func reviewFiles(t *testing.T, name string) []string {
	t.Helper()
	files := []string{name + ".proto"}
	more, err := filepath.Glob(filepath.Join(reviewDir, name, "*.proto"))
	require.NoError(t, err)
	for _, m := range more {
		files = append(files, name+"/"+filepath.Base(m))
	}
	return files
}

func reviewCases(t *testing.T) []string {
	t.Helper()
	protos, err := filepath.Glob(filepath.Join(reviewDir, "*.proto"))
	require.NoError(t, err)
	require.NotEmpty(t, protos)
	names := make([]string, len(protos))
	for i, p := range protos {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".proto")
	}
	return names
}

// lines splits a golden or output into its non-empty lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// expectedLint returns the lint findings a review case's golden promises
// and a filter for the findings to compare with them. protoc-gen-saga
// prints only the errors of a contract that has errors (its warnings are
// dropped with the output), and stops at go-package findings; buf lint
// reports everything, so only the findings the golden can show are
// compared.
func expectedLint(t *testing.T, name string) (want []string, compared func(line string) bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(reviewDir, name+".err"))
	require.NoError(t, err)
	want = lines(string(b))
	hasErrors := slices.ContainsFunc(want, func(l string) bool { return !strings.Contains(l, ": warning: ") })
	goPackage := slices.ContainsFunc(want, func(l string) bool { return strings.Contains(l, ": go-package: ") })
	return want, func(line string) bool {
		switch {
		case goPackage:
			return strings.Contains(line, ": go-package: ")
		case hasErrors:
			return !strings.Contains(line, ": warning: ")
		}
		return true
	}
}

// TestLintMatchesTheGenerator runs every lint rule on every design-review
// case and asserts the findings protoc-gen-saga prints for it
// (testdata/review/<case>.err): same rule, position, message and hint.
func TestLintMatchesTheGenerator(t *testing.T) {
	t.Parallel()
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	for _, name := range reviewCases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			req, err := (&checktest.RequestSpec{
				Files:   &checktest.ProtoFileSpec{DirPaths: []string{reviewDir, optionsDir}, FilePaths: reviewFiles(t, name)},
				RuleIDs: lintRuleIDs(),
			}).ToRequest(t.Context())
			require.NoError(t, err)
			resp, err := client.Check(t.Context(), req)
			require.NoError(t, err)
			want, compared := expectedLint(t, name)
			var got []string
			for _, a := range resp.Annotations() {
				if l := reviewLine(t, a); compared(l) {
					got = append(got, l)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			require.Equal(t, want, got)
			if name == "valid" {
				require.Empty(t, resp.Annotations(), "a valid contract has no findings at all")
			}
		})
	}
}

// TestLintDefaultRules: with no rule ids, buf runs the default rules: the
// review's errors, not its warnings.
func TestLintDefaultRules(t *testing.T) {
	t.Parallel()
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	for name, want := range map[string]int{"reply_unused": 0, "command_idempotency": 1} {
		req, err := (&checktest.RequestSpec{
			Files: &checktest.ProtoFileSpec{DirPaths: []string{reviewDir, optionsDir}, FilePaths: reviewFiles(t, name)},
		}).ToRequest(t.Context())
		require.NoError(t, err)
		resp, err := client.Check(t.Context(), req)
		require.NoError(t, err)
		require.Len(t, resp.Annotations(), want, name)
	}
}

// TestLintManagedMode: a contract without go_package (buf's managed mode
// adds it when generating) gets a go-package finding, and the rest of the
// review still runs on it: the case's error, and the warning that its
// command is sent by no saga (the golden leaves it out: protoc-gen-saga
// drops warnings with the output of a contract that has errors).
func TestLintManagedMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join(reviewDir, "command_idempotency.proto"))
	require.NoError(t, err)
	var kept []string
	for _, l := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(l, "option go_package") {
			kept = append(kept, l)
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "command_idempotency.proto"), []byte(strings.Join(kept, "\n")), 0o644))
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	req, err := (&checktest.RequestSpec{
		Files:   &checktest.ProtoFileSpec{DirPaths: []string{dir, optionsDir}, FilePaths: []string{"command_idempotency.proto"}},
		RuleIDs: lintRuleIDs(),
	}).ToRequest(context.Background())
	require.NoError(t, err)
	resp, err := client.Check(t.Context(), req)
	require.NoError(t, err)
	var rules []string
	for _, a := range resp.Annotations() {
		rules = append(rules, a.RuleID())
	}
	require.ElementsMatch(t, []string{"SAGA_GO_PACKAGE", "SAGA_COMMAND_IDEMPOTENCY", "SAGA_COMMAND_UNUSED"}, rules)
}

// laterOption is a contract whose saga.v1 option is its message's second
// option statement. Both statements are recorded under the message's
// options path, whose first location, the one an annotation's source path
// names, is `option deprecated = true;`.
const laterOption = `syntax = "proto3";

package bufcheck.later;

import "saga/v1/saga.proto";

option go_package = "example.com/later;later";

message Reserve {
  option deprecated = true;
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock"};
  string id = 1;
}
`

// generatorFindings returns "file:line:col: rule-id" of every finding
// protoc-gen-saga reports on files (the files to generate) with warnings
// promoted to errors, reading them and their imports from image.
func generatorFindings(t *testing.T, image *descriptorpb.FileDescriptorSet, files ...string) []string {
	t.Helper()
	req := generatorRequest(t, image, files)
	req.Parameter = proto.String("warnings=error")
	// Through the wire format, as protoc-gen-saga receives it: the
	// options are decoded by this binary's registry.
	b, err := proto.Marshal(req)
	require.NoError(t, err)
	req = &pluginpb.CodeGeneratorRequest{}
	require.NoError(t, proto.Unmarshal(b, req))
	var warn bytes.Buffer
	resp := gen.Response(req, &warn)
	require.NotNil(t, resp.Error, "protoc-gen-saga accepted the contract")
	var out []string
	for _, l := range lines(resp.GetError()) {
		parts := strings.SplitN(l, ": ", 3)
		require.Len(t, parts, 3, l)
		out = append(out, parts[0]+": "+parts[1])
	}
	slices.Sort(out)
	return out
}

// TestLintOptionAfterAnotherOption: the plugin names a finding at an
// option statement that is not its declaration's first by a path whose
// first location is that statement, so it points where the generator does.
func TestLintOptionAfterAnotherOption(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "later_option.proto"), []byte(laterOption), 0o644))
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	req, err := (&checktest.RequestSpec{
		Files:   &checktest.ProtoFileSpec{DirPaths: []string{dir, optionsDir}, FilePaths: []string{"later_option.proto"}},
		RuleIDs: lintRuleIDs(),
	}).ToRequest(t.Context())
	require.NoError(t, err)
	resp, err := client.Check(t.Context(), req)
	require.NoError(t, err)
	var got []string
	for _, a := range resp.Annotations() {
		l := reviewLine(t, a)
		got = append(got, l[:strings.Index(l, ": ")+2]+reviewRule(t, a.RuleID()).ID)
	}
	slices.Sort(got)
	want := []string{
		"later_option.proto:11:3: command-idempotency",
		"later_option.proto:11:3: command-unused",
	}
	require.Equal(t, want, got)
	image := &descriptorpb.FileDescriptorSet{}
	for _, fd := range req.FileDescriptors() {
		image.File = append(image.File, fd.FileDescriptorProto())
	}
	require.Equal(t, want, generatorFindings(t, image, "later_option.proto"))
}
