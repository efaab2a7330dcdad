package gen

import (
	"errors"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen/model"
)

// checkGoPackages reports, as review findings, the files of req whose Go
// import path cannot be determined: no go_package option and no
// M<file>=<import path> parameter. protogen refuses such a request too, but
// its error names no position and no rule.
func checkGoPackages(req *pluginpb.CodeGeneratorRequest) error {
	mapped := map[string]bool{}
	for _, p := range strings.Split(req.GetParameter(), ",") {
		if k, _, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.HasPrefix(k, "M") {
			mapped[k[1:]] = true
		}
	}
	var lines []string
	for _, f := range req.GetProtoFile() {
		if f.GetOptions().GetGoPackage() != "" || mapped[f.GetName()] {
			continue
		}
		line, col := statementPosition(f)
		lines = append(lines, model.Diagnostic{
			Pos:     model.Pos{File: f.GetName(), Line: line, Col: col},
			Rule:    "go-package",
			Message: f.GetName() + " has no go_package option, so its Go import path is unknown",
			Hint:    `add option go_package = "<module path>/<directory>;<package name>"; or pass M` + f.GetName() + "=<import path> as a plugin parameter",
		}.Error())
	}
	if len(lines) == 0 {
		return nil
	}
	return errors.New(strings.Join(lines, "\n"))
}

// statementPosition is where f's package statement is (1-based), else its
// syntax statement, else 1:1.
func statementPosition(f *descriptorpb.FileDescriptorProto) (line, col int) {
	const fieldPackage, fieldSyntax = 2, 12
	for _, field := range []int32{fieldPackage, fieldSyntax} {
		for _, loc := range f.GetSourceCodeInfo().GetLocation() {
			if slices.Equal(loc.GetPath(), []int32{field}) && len(loc.GetSpan()) >= 2 {
				return int(loc.GetSpan()[0]) + 1, int(loc.GetSpan()[1]) + 1
			}
		}
	}
	return 1, 1
}
