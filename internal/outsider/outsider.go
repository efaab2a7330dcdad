// Package outsider lets a test act as a team that uses this project from its
// own repository: a Go module in a temporary directory, outside this
// checkout, that gets github.com/protosaga/saga the way a user does
// (`go get`, `go get -tool`) and runs the documented commands literally.
//
// This checkout is served as a module version from a file-based module proxy
// the package builds (a module zip made with golang.org/x/mod/zip from the
// files git would commit: tracked and untracked-but-not-ignored), so the
// outside module sees exactly what a release of this tree would contain and
// nothing else — no replace directive, no symlink, no path into the
// checkout. The version is derived from the content
// (v0.0.0-local-<hash>), so the shared module and build caches can be used
// safely: a changed tree is a new version, an unchanged one is a cache hit.
// Each distinct tree leaves one extracted copy in the module cache
// (`go clean -modcache` removes them).
//
// Everything else the outside module needs comes from the module cache
// (GOMODCACHE/cache/download served as a file proxy) and, for what is not
// cached yet, from the proxy configured in the environment.
//
// A test that also needs services adds their addresses with Setenv and
// starts the user's program with Command.
package outsider

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// ModulePath is the module path this checkout is served as.
const ModulePath = "github.com/protosaga/saga"

// Module is an outside user's Go module.
type Module struct {
	// Dir is the module's root directory (in t.TempDir(), outside this
	// checkout).
	Dir string
	// Path is the module path given to `go mod init`.
	Path string
	// Version is the version of github.com/protosaga/saga the module proxy
	// serves: `go get github.com/protosaga/saga@` + Version.
	Version string
	// Env is the environment commands run with: the test's own, with the
	// module proxy and checksum settings that serve this checkout, GOWORK=off
	// and GOTOOLCHAIN=local. Setenv and PrependPath change it.
	Env []string
}

// New creates an empty Go module with module path path (`go mod init path`)
// in a fresh temporary directory and serves this checkout to it as
// github.com/protosaga/saga@<Version>. It fails the test when go is missing
// or the checkout cannot be served.
func New(t testing.TB, path string) *Module {
	t.Helper()
	root := RepoRoot(t)
	base := t.TempDir()
	proxy := filepath.Join(base, "proxy")
	version, err := serve(root, proxy)
	if err != nil {
		t.Fatalf("serve %s as a module version: %v", root, err)
	}
	m := &Module{Dir: filepath.Join(base, "module"), Path: path, Version: version}
	if err := os.Mkdir(m.Dir, 0o755); err != nil {
		t.Fatalf("create the outside module's directory: %v", err)
	}
	m.Env, err = environ(proxy)
	if err != nil {
		t.Fatalf("environment for the outside module: %v", err)
	}
	m.Run(t, ".", "go", "mod", "init", path)
	return m
}

// Setenv sets one variable of Env (replacing an earlier value).
func (m *Module) Setenv(key, value string) {
	m.Env = setenv(m.Env, key, value)
}

// PrependPath puts dir first on Env's PATH, so commands (and the plugins
// buf and protoc start) find the programs in it by name.
func (m *Module) PrependPath(dir string) {
	m.Setenv("PATH", dir+string(os.PathListSeparator)+getenv(m.Env, "PATH"))
}

// WriteFile writes content to rel (a slash path relative to Dir), creating
// directories as needed.
func (m *Module) WriteFile(t testing.TB, rel string, content []byte) {
	t.Helper()
	p := filepath.Join(m.Dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatalf("write %s in the outside module: %v", rel, err)
	}
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatalf("write %s in the outside module: %v", rel, err)
	}
}

// Command returns args as a command in dir (relative to Dir; "." is the
// module root) with Env, its program looked up on Env's PATH. Use it for
// programs that keep running (start, signal, wait); Run for the rest.
func (m *Module) Command(dir string, args ...string) (*exec.Cmd, error) {
	if len(args) == 0 {
		return nil, errors.New("no command")
	}
	prog, err := lookPath(args[0], getenv(m.Env, "PATH"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(prog, args[1:]...)
	cmd.Args[0] = args[0]
	cmd.Dir = filepath.Join(m.Dir, filepath.FromSlash(dir))
	cmd.Env = slices.Clone(m.Env)
	return cmd, nil
}

// Output is what a command wrote.
type Output struct {
	Stdout, Stderr string
}

// Run runs args in dir (relative to Dir) and returns what it wrote. A
// command that cannot start or exits non-zero fails the test with its
// output.
func (m *Module) Run(t testing.TB, dir string, args ...string) Output {
	t.Helper()
	cmd, err := m.Command(dir, args...)
	if err != nil {
		t.Fatalf("run %q in %s: %v", strings.Join(args, " "), dir, err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("run %q in %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), cmd.Dir, err, stdout.String(), stderr.String())
	}
	return Output{Stdout: stdout.String(), Stderr: stderr.String()}
}

// RepoRoot returns the root directory of this checkout (the directory of
// the main module's go.mod as seen from the test's working directory).
func RepoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatalf("the test does not run inside the %s module", ModulePath)
	}
	return filepath.Dir(gomod)
}

// Buf returns the path of the buf this repository pins (tools/go.mod),
// built by `make check-buf` into ~/.cache/protosaga/buf-<version>/buf.
// When it is missing the test fails under CI=true and is skipped otherwise.
func Buf(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "tools", "go.mod"))
	if err != nil {
		t.Fatalf("read the buf pin: %v", err)
	}
	m := bufPin.FindSubmatch(b)
	if m == nil {
		t.Fatalf("tools/go.mod pins no github.com/bufbuild/buf version")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("locate the pinned buf: %v", err)
	}
	bin := filepath.Join(home, ".cache", "protosaga", "buf-"+string(m[1]), "buf")
	if _, err := os.Stat(bin); err != nil {
		missing(t, fmt.Sprintf("the pinned buf %s is not built (%v): run `make check-buf` (make test does)", m[1], err))
	}
	return bin
}

var bufPin = regexp.MustCompile(`(?m)^\s*github\.com/bufbuild/buf (v\S+)`)

// Protoc returns the path of protoc. When it is missing the test fails
// under CI=true and is skipped otherwise.
func Protoc(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("protoc")
	if err != nil {
		missing(t, "protoc is not installed: apt-get install -y protobuf-compiler (make test installs it)")
	}
	return p
}

func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// serve writes a file-based module proxy for this checkout under dir and
// returns the version it serves.
func serve(root, dir string) (string, error) {
	files, err := moduleFiles(root)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f.abs)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f.rel, len(b))
		h.Write(b)
	}
	version := "v0.0.0-local-" + hex.EncodeToString(h.Sum(nil))[:16]

	escaped, err := module.EscapePath(ModulePath)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, infoTime})
	if err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), b, 0o644); err != nil {
			return "", err
		}
	}
	zf, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return "", err
	}
	zfiles := make([]modzip.File, len(files))
	for i, f := range files {
		zfiles[i] = f
	}
	if err := modzip.Create(zf, module.Version{Path: ModulePath, Version: version}, zfiles); err != nil {
		zf.Close()
		return "", err
	}
	if err := zf.Close(); err != nil {
		return "", err
	}
	return version, nil
}

// infoTime is the commit time the proxy reports; the go command only shows
// it, so a fixed value keeps the served version's metadata reproducible.
var infoTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// file is one file of the checkout, as a module zip entry.
type file struct {
	rel string // slash path relative to the checkout's root
	abs string
}

func (f file) Path() string                 { return f.rel }
func (f file) Lstat() (fs.FileInfo, error)  { return os.Lstat(f.abs) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// moduleFiles lists the files git would commit in root (tracked, or
// untracked and not ignored) that exist, sorted. Files of nested modules
// (bench/, tools/) are listed too; the module zip leaves them out.
func moduleFiles(root string) ([]file, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("list the checkout's files with git ls-files in %s: %w: %s", root, err, stderr.String())
	}
	seen := map[string]bool{}
	var files []file
	for _, rel := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if rel == "" || seen[rel] {
			continue
		}
		seen[rel] = true
		abs := filepath.Join(root, filepath.FromSlash(rel))
		fi, err := os.Lstat(abs)
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked but deleted in the work tree
		}
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		files = append(files, file{rel: rel, abs: abs})
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.rel, b.rel) })
	if len(files) == 0 {
		return nil, fmt.Errorf("git ls-files lists no files in %s", root)
	}
	return files, nil
}

// goEnv is `go env` of the test process, read once.
var goEnv = sync.OnceValues(func() (map[string]string, error) {
	out, err := exec.Command("go", "env", "-json", "GOMODCACHE", "GOPROXY", "GONOSUMDB").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, fmt.Errorf("decode go env: %w", err)
	}
	return m, nil
})

// environ returns the test's environment with the go command pointed at the
// proxy in dir first, then the module cache, then the configured proxy.
func environ(proxyDir string) ([]string, error) {
	ge, err := goEnv()
	if err != nil {
		return nil, err
	}
	proxies := []string{fileURL(proxyDir)}
	if mc := ge["GOMODCACHE"]; mc != "" {
		proxies = append(proxies, fileURL(filepath.Join(mc, "cache", "download")))
	}
	if p := ge["GOPROXY"]; p != "" {
		proxies = append(proxies, p)
	}
	nosumdb := ModulePath
	if v := ge["GONOSUMDB"]; v != "" {
		nosumdb += "," + v
	}
	// PWD would name the test's directory, not the command's.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PWD=") })
	for k, v := range map[string]string{
		"GOPROXY":     strings.Join(proxies, ","),
		"GONOSUMDB":   nosumdb,
		"GOWORK":      "off",
		"GOTOOLCHAIN": "local",
	} {
		env = setenv(env, k, v)
	}
	return env, nil
}

func fileURL(dir string) string {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(dir)}).String()
}

func setenv(env []string, key, value string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, key+"=")
	})
	return append(out, key+"="+value)
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds prog on path (a PATH value), as a shell would; a name with
// a slash is used as it is.
func lookPath(prog, path string) (string, error) {
	if strings.ContainsRune(prog, filepath.Separator) {
		return prog, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			continue
		}
		p := filepath.Join(d, prog)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH %s", prog, path)
}
