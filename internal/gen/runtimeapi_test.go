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
// participant.Reply, ...) and compares the set with runtimeAPIFile. Generated
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
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && pkgs[x.Name] != "" {
						used[pkgs[x.Name]+"."+sel.Sel.Name] = true
					}
				}
				return true
			})
		}
	}
	got := strings.Join(slices.Sorted(maps.Keys(used)), "\n") + "\n"
	if *update {
		require.NoError(t, os.WriteFile(runtimeAPIFile, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(runtimeAPIFile)
	require.NoError(t, err)
	require.Equal(t, string(want), got,
		"the runtime identifiers generated code uses changed: if it now needs one that an older runtime lacks, "+
			"bump supportVersion in internal/gen/golang and message.SupportPackageIsVersionN, regenerate, "+
			"then update %s with -update", runtimeAPIFile)
}
