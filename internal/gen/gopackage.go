package gen

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen/model"
)

// checkGoPackages returns the findings of [GoPackageFindings] as one
// error, one finding per line, or nil when there are none.
func checkGoPackages(req *pluginpb.CodeGeneratorRequest) error {
	ds := GoPackageFindings(req)
	if len(ds) == 0 {
		return nil
	}
	lines := make([]string, len(ds))
	for i, d := range ds {
		lines[i] = d.Error()
	}
	return errors.New(strings.Join(lines, "\n"))
}

// GoPackageFindings returns a go-package finding for every file of req
// whose Go import path protogen cannot determine or refuses: no go_package
// option and no M<file>=<import path> parameter, an empty import path
// (go_package ";name", or "M<file>=" without a value), or one without a '.'
// or '/' (a package name written as a path). protogen refuses such a
// request too, but its error names no position and no rule. Import paths
// are read as protogen reads them: the text before ';', an M parameter
// taking precedence over go_package when it gives a path.
func GoPackageFindings(req *pluginpb.CodeGeneratorRequest) []model.Diagnostic {
	mapped := map[string]string{}
	for _, p := range strings.Split(req.GetParameter(), ",") {
		if k, v, ok := strings.Cut(p, "="); ok && strings.HasPrefix(k, "M") {
			if path := importPath(v); path != "" {
				mapped[k[1:]] = path
			}
		}
	}
	var ds []model.Diagnostic
	for _, f := range req.GetProtoFile() {
		name, goPackage := f.GetName(), f.GetOptions().GetGoPackage()
		path, from := mapped[name], "M"+name+"="+mapped[name]
		if path == "" {
			path, from = importPath(goPackage), "go_package "+fmt.Sprintf("%q", goPackage)
		}
		var msg string
		switch {
		case path == "" && goPackage != "":
			msg = fmt.Sprintf("%s: go_package %q has no import path before ';', so its Go import path is unknown", name, goPackage)
		case path == "":
			msg = name + " has no go_package option, so its Go import path is unknown"
		case !strings.ContainsAny(path, "./"):
			msg = fmt.Sprintf("%s: Go import path %q (from %s) has no '.' or '/'; it looks like a package name, not an import path", name, path, from)
		default:
			continue
		}
		line, col := statementPosition(f)
		ds = append(ds, model.Diagnostic{
			Pos:     model.Pos{File: name, Line: line, Col: col},
			Rule:    "go-package",
			Message: msg,
			Hint:    `add option go_package = "<module path>/<directory>;<package name>"; or pass M` + name + "=<import path> as a plugin parameter",
		})
	}
	return ds
}

// importPath is the Go import path of a go_package option or an M
// parameter's value: the text before ';' (protogen's
// splitImportPathAndPackageName).
func importPath(goPackage string) string {
	path, _, _ := strings.Cut(goPackage, ";")
	return path
}

// statementPosition is where f's go_package option is (1-based), else its
// package statement, else its syntax statement, else 1:1.
func statementPosition(f *descriptorpb.FileDescriptorProto) (line, col int) {
	const fieldOptions, fieldGoPackage, fieldPackage, fieldSyntax = 8, 11, 2, 12
	for _, p := range [][]int32{{fieldOptions, fieldGoPackage}, {fieldPackage}, {fieldSyntax}} {
		for _, loc := range f.GetSourceCodeInfo().GetLocation() {
			if slices.Equal(loc.GetPath(), p) && len(loc.GetSpan()) >= 2 {
				return int(loc.GetSpan()[0]) + 1, int(loc.GetSpan()[1]) + 1
			}
		}
	}
	return 1, 1
}
