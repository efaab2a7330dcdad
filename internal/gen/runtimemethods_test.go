package gen_test

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runtimeMethodsFile lists the runtime methods and struct fields that the
// examples' generated Go reaches through values.
const runtimeMethodsFile = "testdata/runtime_methods.txt"

// TestGeneratedRuntimeMethods type-checks the examples' packages and lists
// every runtime method and struct field their generated files
// (*.saga.go, *.sagatest.go) select on a value (e.Handle(...),
// st.State), by the runtime type that declares it, and compares the list
// with runtimeMethodsFile. TestGeneratedRuntimeAPI reads the generated code
// as syntax and cannot tell such a selector from any other; this test sees
// the types, for the code the examples generate. When it fails because the
// list grew, generated code needs something older runtimes may lack: bump
// supportVersion in internal/gen/golang and message.SupportPackageIsVersionN,
// regenerate, then update the list with
// go test ./internal/gen -run TestGeneratedRuntimeMethods -update.
func TestGeneratedRuntimeMethods(t *testing.T) {
	t.Parallel()
	// Export data of every package the examples need, from the build cache.
	cmd := exec.Command("go", "list", "-export", "-deps", "-f",
		"{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{join .GoFiles \",\"}}", "./examples/...")
	cmd.Dir = repoRoot
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list -export ./examples/...")
	exports := map[string]string{}
	type pkg struct{ path, dir string }
	var generated []pkg
	files := map[string][]string{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		f := strings.Split(strings.TrimRight(line, "\n"), "\t")
		require.Len(t, f, 4, "go list line %q", line)
		exports[f[0]] = f[1]
		if !strings.HasPrefix(f[0], "github.com/protosaga/saga/examples/") {
			continue
		}
		files[f[0]] = strings.Split(f[3], ",")
		if slices.ContainsFunc(files[f[0]], isSagaGo) {
			generated = append(generated, pkg{f[0], f[2]})
		}
	}
	require.NotEmpty(t, generated, "no example package with generated files")

	used := map[string]bool{}
	for _, p := range generated {
		fset := token.NewFileSet()
		var parsed []*ast.File
		for _, name := range files[p.path] {
			f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			parsed = append(parsed, f)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
		conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			return os.Open(exports[path])
		})}
		_, err := conf.Check(p.path, fset, parsed, info)
		require.NoError(t, err, "type-check %s", p.path)
		for _, f := range parsed {
			if !isSagaGo(filepath.Base(fset.Position(f.Pos()).Filename)) {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if s := info.Selections[sel]; s != nil {
						if name := runtimeMember(s); name != "" {
							used[name] = true
						}
					}
				}
				return true
			})
		}
	}
	checkRuntimeUse(t, runtimeMethodsFile, "methods and fields", used)
}

// isSagaGo reports whether a file name is one protoc-gen-saga writes.
func isSagaGo(name string) bool {
	return strings.HasSuffix(name, ".saga.go") || strings.HasSuffix(name, ".sagatest.go")
}

// runtimeMember names the method or field s selects as
// "runtime/pkg.Type.Name" when a runtime type declares it, else "".
func runtimeMember(s *types.Selection) string {
	obj := s.Obj()
	if obj.Pkg() == nil || !strings.HasPrefix(obj.Pkg().Path(), "github.com/protosaga/saga/runtime/") {
		return ""
	}
	var owner types.Type
	switch o := obj.(type) {
	case *types.Func:
		owner = o.Type().(*types.Signature).Recv().Type()
	case *types.Var:
		// Follow the embedded fields the selection goes through to the
		// struct that declares the field.
		owner = s.Recv()
		for _, i := range s.Index()[:len(s.Index())-1] {
			owner = structOf(owner).Field(i).Type()
		}
	}
	if p, ok := owner.(*types.Pointer); ok {
		owner = p.Elem()
	}
	named, ok := types.Unalias(owner).(*types.Named)
	if !ok {
		return ""
	}
	return strings.TrimPrefix(obj.Pkg().Path(), "github.com/protosaga/saga/") + "." + named.Obj().Name() + "." + obj.Name()
}

// structOf is the struct type under t (through a pointer).
func structOf(t types.Type) *types.Struct {
	if p, ok := t.Underlying().(*types.Pointer); ok {
		t = p.Elem()
	}
	return t.Underlying().(*types.Struct)
}
