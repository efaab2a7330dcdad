package gen

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"path"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
)

// versionName is an import name that is only a major version, as protogen
// names imports after their path's last element: "v5" for
// github.com/jackc/pgx/v5, "v1", "v12" for …/shop/payment/v1.
var versionName = regexp.MustCompile(`^v[0-9]+$`)

// packageNames maps the import paths of the request's Go packages to the
// names their go_package gives them ("orderv1").
func packageNames(plugin *protogen.Plugin) map[string]string {
	names := map[string]string{}
	for _, f := range plugin.Files {
		names[string(f.GoImportPath)] = string(f.GoPackageName)
	}
	return names
}

// readableImports renames, in the Go source src, the imports named only by
// a major version to what a reader knows them by: the package's own name
// when the request declares it (names, see packageNames), otherwise the
// path element before the version ("pgx"). A name that would clash with
// another import or with any identifier in the file is not used: that
// import keeps its name. src is returned unchanged when nothing is renamed.
func readableImports(src []byte, names map[string]string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			used[id.Name] = true
		}
		return true
	})
	rename := map[string]string{}
	for _, imp := range f.Imports {
		if imp.Name == nil || !versionName.MatchString(imp.Name.Name) {
			continue
		}
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			return nil, err
		}
		want := names[p]
		if want == "" || versionName.MatchString(want) {
			want = strings.NewReplacer("-", "_", ".", "_").Replace(path.Base(path.Dir(p)))
		}
		if !token.IsIdentifier(want) || token.IsKeyword(want) || want == "_" || used[want] {
			continue
		}
		used[want] = true
		rename[imp.Name.Name] = want
		imp.Name.Name = want
	}
	if len(rename) == 0 {
		return src, nil
	}
	// Package references are the identifiers the parser could not resolve
	// in the file (a local variable named like an import resolves to it).
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
				if to, ok := rename[id.Name]; ok {
					id.Name = to
				}
			}
		}
		return true
	})
	var out bytes.Buffer
	if err := format.Node(&out, fset, f); err != nil {
		return nil, fmt.Errorf("format: %w", err)
	}
	return out.Bytes(), nil
}
