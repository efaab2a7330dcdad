package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
	"github.com/protosaga/saga/internal/outsider"
)

// reviewCase is one design-review case of testdata/review: its files
// (x.proto and every x/*.proto, relative to testdata/review) and its golden
// output.
type reviewCase struct {
	name   string
	files  []string
	golden string
}

func reviewCases(t *testing.T) []reviewCase {
	t.Helper()
	root := filepath.Join(repoRoot, "testdata", "review")
	protos, err := filepath.Glob(filepath.Join(root, "*.proto"))
	require.NoError(t, err)
	require.NotEmpty(t, protos)
	var cases []reviewCase
	for _, p := range protos {
		name := strings.TrimSuffix(filepath.Base(p), ".proto")
		c := reviewCase{name: name, files: []string{filepath.Base(p)}}
		more, err := filepath.Glob(filepath.Join(root, name, "*.proto"))
		require.NoError(t, err)
		for _, m := range more {
			c.files = append(c.files, name+"/"+filepath.Base(m))
		}
		b, err := os.ReadFile(filepath.Join(root, name+".err"))
		require.NoError(t, err)
		c.golden = string(b)
		cases = append(cases, c)
	}
	return cases
}

// TestReviewThroughBuf runs every design-review case through the pinned buf
// (`buf generate` in a workspace of the options module and the case's
// module, the plugin as a local plugin with strategy: all) and requires
// buf's output to be the golden, positions included: findings point at the
// same line and column under buf as under the in-process compiler.
func TestReviewThroughBuf(t *testing.T) {
	t.Parallel()
	b := newBufRunner(t)
	for _, c := range reviewCases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			files := map[string][]byte{}
			for _, f := range c.files {
				src, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "review", filepath.FromSlash(f)))
				require.NoError(t, err)
				files[f] = src
			}
			got, failed := b.review(t, files)
			require.Equal(t, isError(c.golden), failed, "buf's outcome differs from the golden:\n%s", got)
			require.Equal(t, c.golden, got, "buf's findings differ from testdata/review/%s.err", c.name)
		})
	}
}

// TestBufListLiteralSteps: steps written as one list literal are the shape
// whose positions differ between buf and protocompile
// (docs/design-review.md). buf records one location for the list and
// numbers the entry after it as the list's second element; the review
// then points every step finding at the saga option rather than at a wrong
// step.
func TestBufListLiteralSteps(t *testing.T) {
	t.Parallel()
	b := newBufRunner(t)
	src := `syntax = "proto3";
package lists;
import "saga/v1/saga.proto";
option go_package = "example.com/lists;lists";
message Start {
  option (saga.v1.message) = {kind: KIND_COMMAND, idempotency_key: ["id"]};
  string id = 1;
}
message Approved {
  option (saga.v1.message) = {kind: KIND_EVENT, correlation_field: "id"};
  string id = 1;
}
message OrderData {
  option (saga.v1.saga) = {
    start: "Start"
    business_key: "id"
    steps: [
      {name: "One", role: ROLE_COMPENSATABLE, external: true, success: "Approved", timeout: "1h", late_reply: LATE_REPLY_IGNORE},
      {name: "Two", role: ROLE_PIVOT, external: true, success: "Approved", timeout: "soon", late_reply: LATE_REPLY_IGNORE}
    ]
    steps {name: "Three", role: ROLE_RETRIABLE, external: true, success: "Approved", timeout: "later", late_reply: LATE_REPLY_IGNORE}
  };
  string id = 1;
}
`
	got, failed := b.review(t, map[string][]byte{"lists.proto": []byte(src)})
	require.True(t, failed)
	for l := range strings.Lines(got) {
		require.True(t, strings.HasPrefix(l, "lists.proto:14:3: "), "a step finding under buf points at the saga option: %s", l)
	}
	require.Contains(t, got, `step Two: invalid timeout "soon"`)
	require.Contains(t, got, `step Three: invalid timeout "later"`)
}

// bufRunner runs the built plugin under the pinned buf.
type bufRunner struct {
	buf, plugin string
	options     []byte
}

func newBufRunner(t *testing.T) *bufRunner {
	t.Helper()
	buf := outsider.Buf(t)
	options, err := os.ReadFile(filepath.Join(repoRoot, "options", "saga", "v1", "saga.proto"))
	require.NoError(t, err)
	return &bufRunner{buf: buf, plugin: build(t), options: options}
}

// review runs `buf generate` in a workspace of the options module and a
// module of files (path → content), the plugin a local plugin with
// strategy: all, and returns the plugin's findings and whether generation
// failed.
func (b *bufRunner) review(t *testing.T, files map[string][]byte) (string, bool) {
	t.Helper()
	ws := t.TempDir()
	write := func(rel string, content []byte) {
		p := filepath.Join(ws, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, content, 0o644))
	}
	write("buf.yaml", []byte("version: v2\nmodules:\n  - path: options\n  - path: case\n"))
	write("buf.gen.yaml", []byte("version: v2\nplugins:\n  - local: "+strconv.Quote(b.plugin)+"\n    out: out\n    strategy: all\n"))
	write("options/saga/v1/saga.proto", b.options)
	for rel, content := range files {
		write("case/"+rel, content)
	}
	cmd := exec.Command(b.buf, "generate")
	cmd.Dir = ws
	// buf's cache stays inside the test's directory.
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+filepath.Join(ws, ".cache"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	require.Empty(t, stdout.String())
	got := stderr.String()
	if runErr == nil {
		return got, false
	}
	var exit *exec.ExitError
	require.True(t, errors.As(runErr, &exit), "run buf: %v", runErr)
	prefix := "Failure: plugin " + b.plugin + ": "
	require.True(t, strings.HasPrefix(got, prefix), "buf failed for another reason than the review:\n%s", got)
	return strings.TrimPrefix(got, prefix), true
}

// TestReviewThroughProtoc runs every design-review case through plain
// protoc. protoc records no positions inside an option's message literal, so
// a finding there points at the start of its option statement; every other
// finding points where the golden does, and the findings are the same.
func TestReviewThroughProtoc(t *testing.T) {
	t.Parallel()
	protocBin := outsider.Protoc(t)
	plugin := build(t)
	root := filepath.Join(repoRoot, "testdata", "review")
	for _, c := range reviewCases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"-I", root, "-I", filepath.Join(repoRoot, "options"),
				"--plugin=protoc-gen-saga=" + plugin, "--saga_out=" + t.TempDir()}
			cmd := exec.Command(protocBin, append(args, c.files...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()
			require.Empty(t, stdout.String())
			// protoc's own warning about imports that only the review
			// uses (its files are in one request anyway) is not a finding.
			got := unusedImportRE.ReplaceAllString(stderr.String(), "")
			if runErr != nil {
				require.True(t, strings.HasPrefix(got, "--saga_out: "), "protoc failed for another reason than the review:\n%s", got)
				got = strings.TrimPrefix(got, "--saga_out: ")
			}
			require.Equal(t, runErr != nil, isError(c.golden), "protoc's outcome differs from the golden:\n%s", got)

			// protocompile's standard source info is protoc's: the same
			// output, in-process.
			req, err := protoc.Request(context.Background(), protoc.Options{
				ImportPaths: []string{root, filepath.Join(repoRoot, "options")},
				SourceInfo:  protocompile.SourceInfoStandard,
			}, c.files...)
			require.NoError(t, err)
			resp := gen.Response(req, io.Discard)
			want := resp.GetError() + "\n"
			if resp.Error == nil {
				var warn bytes.Buffer
				gen.Response(req, &warn)
				want = warn.String()
			}
			require.Equal(t, want, got, "protoc's output differs from the in-process review with protoc's source info")

			// Where protoc's position differs from the golden, it is the
			// start of the option statement holding the golden's position.
			statements := optionStatements(req.GetProtoFile())
			goldenLines, protocLines := findings(t, c.golden), findings(t, got)
			require.Len(t, protocLines, len(goldenLines))
			for i, g := range goldenLines {
				p := protocLines[i]
				require.Equal(t, g.text, p.text)
				require.Len(t, p.pos, len(g.pos))
				for j, gp := range g.pos {
					pp := p.pos[j]
					if gp == pp {
						continue
					}
					require.True(t, slices.ContainsFunc(statements[gp.file], func(s span) bool {
						return s.start == pp && s.contains(gp)
					}), "protoc points %s at %v, the golden at %v: not the option statement around it", g.text, pp, gp)
				}
			}
		})
	}
}

func isError(out string) bool {
	return out != "" && !strings.Contains(strings.SplitN(out, "\n", 2)[0], ": warning: ")
}

type position struct {
	file      string
	line, col int
}

// finding is one line of review output: its position and the positions
// its message names ("(other.proto:17:3)"), and its text with those
// replaced by "(…)".
type finding struct {
	pos  []position
	text string // "rule-id: message (hint: ...)"
}

var (
	findingRE      = regexp.MustCompile(`^([^:]+):(\d+):(\d+): (.*)$`)
	namedPosRE     = regexp.MustCompile(`\(([^ ():]+\.proto):(\d+):(\d+)\)`)
	unusedImportRE = regexp.MustCompile(`(?m)^[^ :]+\.proto:\d+:\d+: warning: Import [^ ]+ is unused\.\n`)
)

// findings parses review output, sorted by text (then position), so that
// outputs sorted by different positions pair up.
func findings(t *testing.T, out string) []finding {
	t.Helper()
	var fs []finding
	for l := range strings.Lines(out) {
		m := findingRE.FindStringSubmatch(strings.TrimSuffix(l, "\n"))
		require.NotNil(t, m, "not a finding: %q", l)
		f := finding{pos: []position{atoi(m[1], m[2], m[3])}}
		f.text = namedPosRE.ReplaceAllStringFunc(m[4], func(s string) string {
			n := namedPosRE.FindStringSubmatch(s)
			f.pos = append(f.pos, atoi(n[1], n[2], n[3]))
			return "(…)"
		})
		fs = append(fs, f)
	}
	slices.SortFunc(fs, func(a, b finding) int {
		if c := strings.Compare(a.text, b.text); c != 0 {
			return c
		}
		return strings.Compare(fmt.Sprint(a.pos), fmt.Sprint(b.pos))
	})
	return fs
}

func atoi(file, line, col string) position {
	l, _ := strconv.Atoi(line)
	c, _ := strconv.Atoi(col)
	return position{file, l, c}
}

type span struct{ start, end position }

func (s span) contains(p position) bool {
	after := p.line > s.start.line || (p.line == s.start.line && p.col >= s.start.col)
	before := p.line < s.end.line || (p.line == s.end.line && p.col < s.end.col)
	return after && before
}

// optionStatements returns, by file, the spans of every message option
// statement (source path [4, i, (3, j)*, 7]), 1-based.
func optionStatements(files []*descriptorpb.FileDescriptorProto) map[string][]span {
	out := map[string][]span{}
	for _, f := range files {
		for _, loc := range f.GetSourceCodeInfo().GetLocation() {
			p, s := loc.GetPath(), loc.GetSpan()
			if len(p) < 3 || p[0] != 4 || p[len(p)-1] != 7 {
				continue
			}
			endLine, endCol := s[0], s[2]
			if len(s) == 4 {
				endLine, endCol = s[2], s[3]
			}
			out[f.GetName()] = append(out[f.GetName()], span{
				start: position{f.GetName(), int(s[0]) + 1, int(s[1]) + 1},
				end:   position{f.GetName(), int(endLine) + 1, int(endCol) + 1},
			})
		}
	}
	return out
}
