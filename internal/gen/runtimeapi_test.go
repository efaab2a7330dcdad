package gen_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen/regen"
)

// runtimeAPIFile lists the runtime identifiers generated code refers to,
// with the support version it asserts.
const runtimeAPIFile = "testdata/runtime_api.txt"

// TestGeneratedRuntimeAPI collects every package-level runtime identifier
// that the generated Go of every target refers to (message.Info,
// participant.Reply, ...), and the fields its literals of runtime structs
// set (sagadef.Step.External, ...), and compares the set with runtimeAPIFile. Generated
// code asserts message.SupportPackageIsVersionN so that a runtime too old for
// it fails to compile with that name; the assertion only works if N is bumped
// whenever generated code starts to need something older runtimes lack. When
// this test fails because the list grew, bump supportVersion in
// internal/gen/golang and the runtime's constant, regenerate, then update the
// list with go test ./internal/gen -run TestGeneratedRuntimeAPI -update.
func TestGeneratedRuntimeAPI(t *testing.T) {
	t.Parallel()
	used := map[string]bool{}
	for _, target := range regen.Targets() {
		files, err := regen.Generate(context.Background(), repoRoot, target)
		require.NoError(t, err)
		for name, src := range files {
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".pb.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.SkipObjectResolution)
			require.NoError(t, err)
			pkgs := map[string]string{} // local name → runtime package path
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				require.NoError(t, err)
				if !strings.HasPrefix(p, "github.com/protosaga/saga/runtime/") {
					continue
				}
				local := path.Base(p)
				if imp.Name != nil {
					local = imp.Name.Name
				}
				pkgs[local] = strings.TrimPrefix(p, "github.com/protosaga/saga/")
			}
			// runtimeName returns "runtime/pkg.Name" for a selector of a
			// runtime package, or "".
			runtimeName := func(e ast.Expr) string {
				if sel, ok := e.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && pkgs[x.Name] != "" {
						return pkgs[x.Name] + "." + sel.Sel.Name
					}
				}
				return ""
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if name := runtimeName(n); name != "" {
						used[name] = true
					}
				case *ast.CompositeLit:
					// The fields a literal of a runtime struct sets
					// (sagadef.Step{External: ...}): a field an older
					// runtime lacks breaks the build as a name does.
					fields := func(name string, lit *ast.CompositeLit) {
						for _, el := range lit.Elts {
							if kv, ok := el.(*ast.KeyValueExpr); ok {
								if key, ok := kv.Key.(*ast.Ident); ok {
									used[name+"."+key.Name] = true
								}
							}
						}
					}
					if name := runtimeName(n.Type); name != "" {
						fields(name, n)
					}
					// []sagadef.Step{{Name: ...}}: elements without a type.
					if arr, ok := n.Type.(*ast.ArrayType); ok {
						elt := arr.Elt
						if star, ok := elt.(*ast.StarExpr); ok {
							elt = star.X
						}
						if name := runtimeName(elt); name != "" {
							for _, el := range n.Elts {
								if lit, ok := el.(*ast.CompositeLit); ok && lit.Type == nil {
									fields(name, lit)
								}
							}
						}
					}
				}
				return true
			})
		}
	}
	checkRuntimeUse(t, runtimeAPIFile, "identifiers", used)
}

// checkRuntimeUse compares the runtime names generated code uses (what:
// identifiers, methods and fields) with the list in file, or rewrites the
// list with -update. A change in the list is the prompt to look at the
// support version: if generated code now needs something an older runtime
// lacks, it must assert the next one.
func checkRuntimeUse(t *testing.T, file, what string, used map[string]bool) {
	t.Helper()
	got := strings.Join(slices.Sorted(maps.Keys(used)), "\n") + "\n"
	if *update {
		require.NoError(t, os.WriteFile(file, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(want), got,
		"the runtime %s generated code uses changed: if it now needs one that an older runtime lacks, "+
			"bump supportVersion in internal/gen/golang and message.SupportPackageIsVersionN, regenerate, "+
			"then update %s with -update", what, file)
}

// maxRuntimeImports is how many runtime packages one generated contract file
// may import: the runtime's public surface as generated code sees it.
const maxRuntimeImports = 6

// TestGeneratedCodeImportsFewRuntimePackages holds every generated .saga.go
// file of every target to maxRuntimeImports runtime packages. Generated test
// packages (<pkg>test) are not counted: they import runtime/sagatest on top.
func TestGeneratedCodeImportsFewRuntimePackages(t *testing.T) {
	t.Parallel()
	for _, target := range regen.Targets() {
		files, err := regen.Generate(context.Background(), repoRoot, target)
		require.NoError(t, err)
		for name, src := range files {
			if !strings.HasSuffix(name, ".saga.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
			require.NoError(t, err)
			var runtime []string
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				require.NoError(t, err)
				if strings.HasPrefix(p, "github.com/protosaga/saga/runtime/") {
					runtime = append(runtime, strings.TrimPrefix(p, "github.com/protosaga/saga/"))
				}
			}
			require.LessOrEqualf(t, len(runtime), maxRuntimeImports,
				"%s imports %d runtime packages %v; generated code reaches the runtime through at most %d",
				name, len(runtime), runtime, maxRuntimeImports)
		}
	}
}
