package bufcheck_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/outsider"
)

// The tests in this file run buf-plugin-saga through the pinned buf, as
// `buf lint` and `buf breaking` run it in a user's repository.

var plugin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if plugin.dir != "" {
		_ = os.RemoveAll(plugin.dir)
	}
	os.Exit(code)
}

// pluginBinary builds buf-plugin-saga once per test run.
func pluginBinary(t *testing.T) string {
	t.Helper()
	plugin.once.Do(func() {
		plugin.dir, plugin.err = os.MkdirTemp("", "buf-plugin-saga-")
		if plugin.err != nil {
			return
		}
		plugin.path = filepath.Join(plugin.dir, "buf-plugin-saga")
		out, err := exec.Command("go", "build", "-o", plugin.path, "../../cmd/buf-plugin-saga").CombinedOutput()
		if err != nil {
			plugin.err = errors.New(string(out))
		}
	})
	require.NoError(t, plugin.err, "build buf-plugin-saga")
	return plugin.path
}

// bufAnnotation is one line of buf's --error-format json.
type bufAnnotation struct {
	Path        string `json:"path"`
	StartLine   int    `json:"start_line"`
	StartColumn int    `json:"start_column"`
	Type        string `json:"type"`
	Message     string `json:"message"`
	Plugin      string `json:"plugin"`
}

// runBuf runs buf with args in dir and returns its annotations; exit code
// 100 (findings) is not an error.
func runBuf(t *testing.T, dir string, args ...string) []bufAnnotation {
	t.Helper()
	cmd := exec.Command(outsider.Buf(t), args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 100) {
		t.Fatalf("buf %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	var out []bufAnnotation
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var a bufAnnotation
		require.NoError(t, json.Unmarshal(sc.Bytes(), &a), "buf output line %q", sc.Text())
		out = append(out, a)
	}
	require.NoError(t, sc.Err())
	return out
}

// writeFile writes content to dir/name, creating directories.
func writeFile(t *testing.T, dir, name string, content []byte) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, content, 0o644))
}

// workspace writes a buf workspace into dir: the saga.v1 options as module
// "options", then the given modules, and the rest of buf.yaml.
func workspace(t *testing.T, dir string, modules []string, config string) {
	t.Helper()
	opts, err := os.ReadFile(filepath.Join(optionsDir, "saga", "v1", "saga.proto"))
	require.NoError(t, err)
	writeFile(t, dir, "options/saga/v1/saga.proto", opts)
	yaml := "version: v2\nmodules:\n  - path: options\n"
	for _, m := range modules {
		yaml += "  - path: " + m + "\n"
	}
	writeFile(t, dir, "buf.yaml", []byte(yaml+config))
}

// TestBufBreaking runs `buf breaking` with the plugin on every pair of
// contract versions: buf reports the findings of the case's golden (buf
// records fewer positions inside option literals than protocompile, so
// positions are compared in TestBreaking only).
func TestBufBreaking(t *testing.T) {
	t.Parallel()
	bin := pluginBinary(t)
	for _, c := range breakingCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			before, after := c.versions(t)
			work := t.TempDir()
			for side, dir := range map[string]string{"old": before, "new": after} {
				src, err := os.ReadFile(filepath.Join(dir, "order.proto"))
				require.NoError(t, err)
				writeFile(t, work, side+"/contract/order.proto", src)
			}
			workspace(t, filepath.Join(work, "old"), []string{"contract"}, "")
			workspace(t, filepath.Join(work, "new"), []string{"contract"},
				"breaking:\n  use: [SAGA_BREAKING]\nplugins:\n  - plugin: "+bin+"\n")
			var got []string
			for _, a := range runBuf(t, work, "breaking", "new", "--against", "old", "--error-format", "json") {
				require.Equal(t, "new/contract/order.proto", a.Path, "%s: %s", a.Type, a.Message)
				require.Equal(t, bin, a.Plugin)
				got = append(got, a.Type+": "+a.Message)
			}
			golden, err := os.ReadFile(filepath.Join(breakingDir, c.name+".golden"))
			require.NoError(t, err)
			var want []string
			for _, l := range lines(string(golden)) {
				l = l[strings.Index(l, ": ")+2:]
				want = append(want, l[:strings.LastIndex(l, " (against ")])
			}
			slices.Sort(got)
			slices.Sort(want)
			require.Equal(t, want, got)
		})
	}
}

// TestBufLint runs `buf lint` with the plugin on every design-review case
// (each a module of one workspace) and compares its findings with what
// protoc-gen-saga reports on the same descriptors from buf (the image of
// `buf build`): same rule, position, message and hint.
func TestBufLint(t *testing.T) {
	t.Parallel()
	bin := pluginBinary(t)
	work := t.TempDir()
	names := reviewCases(t)
	var modules []string
	for _, name := range names {
		for _, f := range reviewFiles(t, name) {
			b, err := os.ReadFile(filepath.Join(reviewDir, filepath.FromSlash(f)))
			require.NoError(t, err)
			writeFile(t, work, "cases/"+name+"/"+f, b)
		}
		modules = append(modules, "cases/"+name)
	}
	workspace(t, work, modules, "lint:\n  use: [SAGA, SAGA_WARNINGS]\nplugins:\n  - plugin: "+bin+"\n")

	linted := map[string][]string{}
	for _, a := range runBuf(t, work, "lint", "--error-format", "json") {
		require.Equal(t, bin, a.Plugin, "%s: %s", a.Type, a.Message)
		parts := strings.SplitN(a.Path, "/", 3)
		require.Len(t, parts, 3, a.Path)
		r := reviewRule(t, a.Type)
		msg := a.Message
		if r.Warning {
			msg = "warning: " + msg
		}
		linted[parts[1]] = append(linted[parts[1]], strings.Join([]string{parts[2], itoa(a.StartLine), itoa(a.StartColumn), " " + r.ID, " " + msg}, ":"))
	}

	runBuf(t, work, "build", "-o", "image.binpb")
	b, err := os.ReadFile(filepath.Join(work, "image.binpb"))
	require.NoError(t, err)
	image := &descriptorpb.FileDescriptorSet{}
	require.NoError(t, proto.Unmarshal(b, image))
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			resp := gen.Response(generatorRequest(t, image, reviewFiles(t, name)), &out)
			generated := out.String()
			if resp.Error != nil {
				generated = resp.GetError()
			}
			want := lines(generated)
			_, compared := expectedLint(t, name)
			var got []string
			for _, l := range linted[name] {
				if compared(l) {
					got = append(got, l)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			require.Equal(t, want, got)
			if name != "valid" {
				require.NotEmpty(t, got, "every case but valid has findings")
			}
		})
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// generatorRequest is the code generator request for files, with the
// files they import from image, as buf generate sends it.
func generatorRequest(t *testing.T, image *descriptorpb.FileDescriptorSet, files []string) *pluginpb.CodeGeneratorRequest {
	t.Helper()
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	for _, f := range image.GetFile() {
		byName[f.GetName()] = f
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: files}
	seen := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		f := byName[name]
		require.NotNil(t, f, "the image has no %s", name)
		for _, dep := range f.GetDependency() {
			visit(dep)
		}
		req.ProtoFile = append(req.ProtoFile, f)
	}
	for _, f := range files {
		visit(f)
	}
	return req
}

// TestBufLintOptionAfterAnotherOption: buf starts an option literal's own
// path at the option's name, so no path names a saga.v1 option statement
// that is not its message's first. The plugin then points at the option's
// name on the statement's line, where the generator points at its
// `option` keyword (docs/design-review.md, "Lint rules").
func TestBufLintOptionAfterAnotherOption(t *testing.T) {
	t.Parallel()
	bin := pluginBinary(t)
	work := t.TempDir()
	writeFile(t, work, "contract/later_option.proto", []byte(laterOption))
	workspace(t, work, []string{"contract"}, "lint:\n  use: [SAGA, SAGA_WARNINGS]\nplugins:\n  - plugin: "+bin+"\n")
	var got []string
	for _, a := range runBuf(t, work, "lint", "--error-format", "json") {
		require.Equal(t, bin, a.Plugin, "%s: %s", a.Type, a.Message)
		got = append(got, strings.Join([]string{a.Path, itoa(a.StartLine), itoa(a.StartColumn), " " + reviewRule(t, a.Type).ID}, ":"))
	}
	slices.Sort(got)
	require.Equal(t, []string{
		"contract/later_option.proto:11:10: command-idempotency",
		"contract/later_option.proto:11:10: command-unused",
	}, got)

	runBuf(t, work, "build", "-o", "image.binpb")
	b, err := os.ReadFile(filepath.Join(work, "image.binpb"))
	require.NoError(t, err)
	image := &descriptorpb.FileDescriptorSet{}
	require.NoError(t, proto.Unmarshal(b, image))
	require.Equal(t, []string{
		"later_option.proto:11:3: command-idempotency",
		"later_option.proto:11:3: command-unused",
	}, generatorFindings(t, image, "later_option.proto"))
}
