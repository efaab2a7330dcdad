package outsider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/outsider"
	"github.com/protosaga/saga/internal/testenv"
)

// The commands of docs/options.md, "Getting the options into your
// workspace", run literally (through sh) in the outside module.
// TestDocsShowTheSteps keeps the documentation and these strings equal.
const (
	stepGetModule = `go get github.com/protosaga/saga@latest`
	stepGetPlugin = `go get -tool github.com/protosaga/saga/cmd/protoc-gen-saga`
	stepGetGo     = `go get -tool google.golang.org/protobuf/cmd/protoc-gen-go`
	stepExport    = `go tool protoc-gen-saga export-options third_party/protosaga`
	stepBufGen    = `buf generate`
	stepBufLint   = `buf lint`
	stepTidy      = `go mod tidy`
	stepTest      = `go test ./...`
	stepInstall   = `GOBIN="$PWD/bin" go install tool`
	stepMkdir     = `mkdir -p gen`
	stepProtoc    = "protoc -I proto -I \"$(go list -m -f '{{.Dir}}' github.com/protosaga/saga)/options\" \\\n" +
		"  --plugin=bin/protoc-gen-go --plugin=bin/protoc-gen-saga \\\n" +
		"  --go_out=gen --go_opt=paths=source_relative \\\n" +
		"  --saga_out=gen --saga_opt=paths=source_relative \\\n" +
		"  $(find proto -name '*.proto')"
	stepBufManaged = `buf generate --template buf.gen.managed.yaml`
	stepBuild      = `go build -o bin/library ./cmd/library`
	stepRun        = `SAGA_PG_URL=postgres://... SAGA_AMQP_URL=amqp://... bin/library`
)

// The workspace files of the documented layout (testdata/library), shown in
// docs/options.md as they are.
var workspaceFiles = []string{"buf.yaml", "buf.gen.yaml", "buf.gen.managed.yaml"}

// TestOwnRepository is a team's journey in its own repository, the README's
// "In your own repository" steps run literally: a Go module outside this
// checkout gets the runtime and the plugins with go get, exports the saga.v1
// options into its buf workspace, generates a small library-loan contract
// with the pinned buf (and, separately, with plain protoc reading the options
// from the Go module cache, and with buf's managed mode), adds its business
// code (testdata/librarycode: the participants, the decider, one host call
// in main), builds it, and runs the service against PostgreSQL and RabbitMQ:
// sagas started over HTTP complete or compensate, a repeated start is the
// same saga, every effect happens once, and SIGTERM stops it cleanly. No
// symlink, no copy by hand, no path into this checkout.
func TestOwnRepository(t *testing.T) {
	t.Parallel()
	buf := outsider.Buf(t)
	outsider.Protoc(t)

	m := outsider.New(t, "example.com/library")
	m.PrependPath(filepath.Dir(buf))
	copyTree(t, m, filepath.Join("testdata", "library"))

	sh := func(step string) outsider.Output {
		t.Helper()
		return m.Run(t, ".", "sh", "-c", step)
	}

	sh(stepGetModule)
	require.Contains(t, readFile(t, m.Dir, "go.mod"), "github.com/protosaga/saga "+m.Version,
		"go get @latest resolves to the served checkout")
	sh(stepGetPlugin)
	sh(stepGetGo)
	var gomod struct{ Tool []struct{ Path string } }
	require.NoError(t, json.Unmarshal([]byte(m.Run(t, ".", "go", "mod", "edit", "-json").Stdout), &gomod))
	require.ElementsMatch(t, []struct{ Path string }{
		{"github.com/protosaga/saga/cmd/protoc-gen-saga"}, {"google.golang.org/protobuf/cmd/protoc-gen-go"},
	}, gomod.Tool)

	out := sh(stepExport)
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: created\n", out.Stdout)
	require.Empty(t, out.Stderr)
	out = sh(stepExport)
	require.Equal(t, "third_party/protosaga/saga/v1/saga.proto: unchanged\n", out.Stdout, "exporting again changes nothing")
	modDir := strings.TrimSpace(m.Run(t, ".", "go", "list", "-m", "-f", "{{.Dir}}", outsider.ModulePath).Stdout)
	require.Equal(t, readFile(t, modDir, "options/saga/v1/saga.proto"), readFile(t, m.Dir, "third_party/protosaga/saga/v1/saga.proto"),
		"the exported options are the module's options/saga/v1/saga.proto")

	// buf: the documented workspace, plugins run with go tool.
	out = sh(stepBufGen)
	require.Empty(t, out.Stdout+out.Stderr, "buf generate prints nothing")
	out = sh(stepBufLint)
	require.Empty(t, out.Stdout+out.Stderr, "buf lint passes with no findings")
	bufGen := generated(t, m.Dir)
	for _, f := range []string{
		"library/billing/v1/billing.pb.go",
		"library/billing/v1/billing.saga.go",
		"library/catalog/v1/catalog.pb.go",
		"library/catalog/v1/catalog.saga.go",
		"library/loan/v1/lend_book.saga.md",
		"library/loan/v1/loan.pb.go",
		"library/loan/v1/loan.saga.go",
		"library/loan/v1/loanv1test/loan.sagatest.go",
		"library/loan/v1/loanv1test/lend_book.scenarios.go",
		"library/loan/v1/loanv1test/lend_book_scenarios_test.go",
		"library/loan/v1/migrations/saga_lend_book/0001_create_saga_lend_book.sql",
		"library/loan/v1/topology.saga.json",
	} {
		require.Contains(t, bufGen, f)
	}
	requireNoOptionsCode(t, m.Dir)
	sh(stepTidy)
	m.Run(t, ".", "go", "build", "./...")
	m.Run(t, ".", "go", "vet", "./...")
	// The generated scenario tests run with no hand-written test (README
	// step 3).
	out = sh(stepTest)
	require.Contains(t, out.Stdout, "loanv1test", "go test runs the generated scenario tests")

	// The team's code: participants, decider, main; go mod tidy again for
	// what it imports (README step 6).
	copyTree(t, m, filepath.Join("testdata", "librarycode"))
	sh(stepTidy)
	m.Run(t, ".", "go", "build", "./...")
	m.Run(t, ".", "go", "vet", "./...")

	// Plain protoc: the options from the Go module cache, plugins built from
	// the module's tool dependencies.
	require.NoError(t, os.RemoveAll(filepath.Join(m.Dir, "gen")))
	sh(stepInstall)
	sh(stepMkdir)
	out = sh(stepProtoc)
	require.Empty(t, out.Stdout+out.Stderr, "protoc prints no warnings")
	requireNoOptionsCode(t, m.Dir)
	requireSameOutput(t, bufGen, generated(t, m.Dir), "buf generate", "protoc", true)
	m.Run(t, ".", "go", "build", "./...")

	// buf with managed mode: go_package_prefix must not move saga.v1.
	require.NoError(t, os.RemoveAll(filepath.Join(m.Dir, "gen")))
	out = sh(stepBufManaged)
	require.Empty(t, out.Stdout+out.Stderr)
	requireNoOptionsCode(t, m.Dir)
	managed := generated(t, m.Dir)
	require.Contains(t, string(managed["library/loan/v1/loan.pb.go"]), `"github.com/protosaga/saga/options/saga/v1"`)
	requireSameOutput(t, bufGen, managed, "buf generate", "buf generate (managed mode)", false)

	runService(t, m, sh)
}

// runService builds the team's service (step 6 of the README) and runs it
// on a fresh schema and vhost until its sagas have ended, then stops it with
// SIGTERM.
func runService(t *testing.T, m *outsider.Module, sh func(string) outsider.Output) {
	t.Helper()
	ctx := context.Background()
	pgURL, amqpURL := testenv.PostgresURL(t), testenv.AMQP(t)
	sh(stepBuild)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cmd, err := m.Command(".", strings.Fields(stepRun)[2])
	require.NoError(t, err)
	cmd.Env = append(cmd.Env, "SAGA_PG_URL="+pgURL, "SAGA_AMQP_URL="+amqpURL,
		"SAGA_HTTP_ADDR="+addr, "SAGA_HTTP_START=true", "SAGA_LOG_FORMAT=text")
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := "http://" + addr
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for !ok() {
			select {
			case err := <-exited:
				t.Fatalf("the service exited (%v) while waiting for %s; its log:\n%s", err, what, logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("waited 90s for %s; the service's log:\n%s", what, logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("readiness", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `INSERT INTO library_copies (copy_id, isbn) VALUES ('c-1', '978-0'), ('c-2', '978-0')`)
	require.NoError(t, err, "the host created the team's own tables at start")

	type started struct {
		SagaID    string `json:"sagaId"`
		StatusURL string `json:"statusUrl"`
		Created   bool   `json:"created"`
	}
	start := func(loan, member string) started {
		t.Helper()
		resp, err := http.Post(base+"/sagas/lend_book", "application/json",
			strings.NewReader(fmt.Sprintf(`{"loanId":%q,"memberId":%q,"isbn":"978-0"}`, loan, member)))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, resp.StatusCode, string(body))
		var st started
		require.NoError(t, json.Unmarshal(body, &st))
		return st
	}
	status := func(s started) string {
		t.Helper()
		resp, err := http.Get(base + s.StatusURL)
		require.NoError(t, err)
		defer resp.Body.Close()
		var st struct{ Status string }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		return st.Status
	}
	lent := start("l-1", "m-1")
	require.True(t, lent.Created)
	declined := start("l-2", "blocked-7")
	again := start("l-1", "m-1")
	require.False(t, again.Created, "a repeated start is the same saga")
	require.Equal(t, lent.SagaID, again.SagaID)
	waitFor("l-1 completed", func() bool { return status(lent) == "completed" })
	waitFor("l-2 failed", func() bool { return status(declined) == "failed" })

	ledger := func(loan string) []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT effect FROM library_ledger WHERE loan_id = $1 ORDER BY id`, loan)
		require.NoError(t, err)
		effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return effects
	}
	var lentCopy string
	require.NoError(t, pool.QueryRow(ctx, `SELECT copy_id FROM library_copies WHERE held_by = 'l-1'`).Scan(&lentCopy))
	require.Equal(t, []string{"held", "charged", "opened " + lentCopy}, ledger("l-1"))
	require.Equal(t, []string{"held", "declined", "returned"}, ledger("l-2"), "the declined loan's copy went back to the shelf")
	var onShelf int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM library_copies WHERE held_by IS NULL`).Scan(&onShelf))
	require.Equal(t, 1, onShelf)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "the service exits 0 on SIGTERM; its log:\n%s", logs.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the service did not stop within 90s of SIGTERM; its log:\n%s", logs.String())
	}
	require.Contains(t, logs.String(), `msg="host stopped"`)
}

// lockedBuffer is a bytes.Buffer a running process and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDocsShowTheSteps: the README's "In your own repository" and
// docs/options.md show the workspace files and the commands
// TestOwnRepository runs, character for character.
func TestDocsShowTheSteps(t *testing.T) {
	t.Parallel()
	readme := readFile(t, outsider.RepoRoot(t), "README.md")
	for _, name := range []string{"buf.yaml", "buf.gen.yaml"} {
		require.Contains(t, readme, "```yaml\n# "+name+"\n"+readFile(t, filepath.Join("testdata", "library"), name)+"```\n",
			"README.md shows %s as testdata/library/%s holds it", name, name)
	}
	for _, step := range []string{stepGetModule, stepGetPlugin, stepGetGo, stepExport, stepBufGen, stepBufLint, stepTidy, stepTest, stepBuild, stepRun} {
		require.Contains(t, readme, "\n"+step+"\n", "README.md shows the command")
	}
	lib := readFile(t, filepath.Join("testdata", "librarycode"), "internal/library/library.go")
	register := lib[strings.Index(lib, "//go:embed"):strings.Index(lib, "func record(")]
	require.Contains(t, readme, "```go\n"+strings.TrimSuffix(register, "\n")+"```\n",
		"README.md shows the Register function the test builds")
	mainGo := readFile(t, filepath.Join("testdata", "librarycode"), "cmd/library/main.go")
	require.Contains(t, mainGo, "\thost.Main(library.Register)\n", "the README's main is the one the test builds")
	require.Contains(t, readme, "\thost.Main(library.Register)\n")

	doc := readFile(t, outsider.RepoRoot(t), "docs/options.md")
	for _, name := range workspaceFiles {
		require.Contains(t, doc, "```yaml\n# "+name+"\n"+readFile(t, filepath.Join("testdata", "library"), name)+"```\n",
			"docs/options.md shows %s as testdata/library/%s holds it", name, name)
	}
	for _, step := range []string{
		stepGetModule, stepGetPlugin, stepGetGo, stepExport, stepBufGen, stepBufLint,
		stepTidy, stepInstall, stepMkdir, stepProtoc, stepBufManaged,
	} {
		require.Contains(t, doc, "\n"+step+"\n", "docs/options.md shows the command")
	}
}

// copyTree writes every file under dir into the module at the same
// relative path.
func copyTree(t *testing.T, m *outsider.Module, dir string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		require.NoError(t, err)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		m.WriteFile(t, filepath.ToSlash(rel), b)
		return nil
	}))
}

// generated returns the files under dir/gen keyed by slash path relative
// to it.
func generated(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	root := filepath.Join(dir, "gen")
	files := map[string][]byte{}
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		require.NoError(t, err)
		files[filepath.ToSlash(rel)], err = os.ReadFile(path)
		return err
	}))
	return files
}

// requireNoOptionsCode fails when Go code was generated for the options
// anywhere in the user's tree: they have their Go package in the module.
func requireNoOptionsCode(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		require.NotEqual(t, "saga.pb.go", d.Name(), "stray Go code for the options at %s", path)
		return nil
	}))
}

// requireSameOutput: both runs wrote the same files, and the same bytes in
// every file protoc-gen-saga wrote. For .pb.go files, pbGo says whether
// their bytes must match too (except the protoc version protoc-gen-go
// stamps into the header); managed mode sets file options into the
// descriptor protoc-gen-go embeds.
func requireSameOutput(t *testing.T, want, got map[string][]byte, wantName, gotName string, pbGo bool) {
	t.Helper()
	require.Equal(t, keys(want), keys(got), "%s and %s write the same files", wantName, gotName)
	for _, name := range keys(want) {
		w, g := want[name], got[name]
		if strings.HasSuffix(name, ".pb.go") {
			if !pbGo {
				continue
			}
			w, g = dropProtocVersion(w), dropProtocVersion(g)
		}
		if !bytes.Equal(w, g) {
			t.Fatalf("%s differs between %s and %s: %s", name, wantName, gotName, firstDiff(w, g))
		}
	}
}

// firstDiff describes the first line where a and b differ.
func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return fmt.Sprintf("line %d: %q != %q", i+1, x, y)
		}
	}
	return "no difference"
}

func dropProtocVersion(b []byte) []byte {
	var out [][]byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("// \tprotoc ")) {
			continue
		}
		out = append(out, line)
	}
	return bytes.Join(out, nil)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func readFile(t *testing.T, dir, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	require.NoError(t, err)
	return string(b)
}
