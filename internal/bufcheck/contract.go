package bufcheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"buf.build/go/bufplugin/check"
	"buf.build/go/bufplugin/descriptor"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/model"
)

// placeholderHost prefixes the Go import path given to a file that has
// none (see [newContract]).
const placeholderHost = "buf-plugin-saga.invalid/"

// contract is one side of a check request (its files, or its against
// files) read the way protoc-gen-saga reads a code generator request.
type contract struct {
	// files are the request's files by path, imports included.
	files map[string]descriptor.FileDescriptor
	// goPackage holds the go-package findings of the files that are not
	// imports.
	goPackage []model.Diagnostic
	plugin    *protogen.Plugin
}

// newContract builds the code generator request protoc-gen-saga would get
// for fds under `strategy: all` (every file that is not an import is a
// file to generate) and the protogen plugin over it.
//
// buf's managed mode sets go_package only when it generates, so a contract
// may have none when it is linted. Files without a usable Go import path
// get a go-package finding and a placeholder import path per directory
// (managed mode's default layout), so that the rest of the review, whose
// Go-package rules compare import paths, still runs.
func newContract(fds []descriptor.FileDescriptor) (*contract, error) {
	c := &contract{files: make(map[string]descriptor.FileDescriptor, len(fds))}
	req := &pluginpb.CodeGeneratorRequest{}
	for _, fd := range topological(fds) {
		name := fd.ProtoreflectFileDescriptor().Path()
		c.files[name] = fd
		req.ProtoFile = append(req.ProtoFile, fd.FileDescriptorProto())
		if !fd.IsImport() {
			req.FileToGenerate = append(req.FileToGenerate, name)
		}
	}
	// Round-trip through the wire format, as a plugin invocation does, so
	// that the saga.v1 options are decoded by this binary's registry.
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode the files as a code generator request: %w", err)
	}
	req = &pluginpb.CodeGeneratorRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, fmt.Errorf("decode the files as a code generator request: %w", err)
	}
	var params []string
	for _, d := range gen.GoPackageFindings(req) {
		dir := path.Dir(d.Pos.File)
		if dir == "." {
			dir = "root"
		}
		params = append(params, "M"+d.Pos.File+"="+placeholderHost+dir)
		if fd := c.files[d.Pos.File]; fd != nil && !fd.IsImport() {
			c.goPackage = append(c.goPackage, d)
		}
	}
	if len(params) > 0 {
		req.Parameter = proto.String(strings.Join(params, ","))
	}
	c.plugin, err = protogen.Options{}.New(req)
	if err != nil {
		return nil, fmt.Errorf("read the files as protoc-gen-saga does: %w", err)
	}
	return c, nil
}

// topological orders fds so that every file follows its imports, as a code
// generator request must; files keep their given order otherwise.
func topological(fds []descriptor.FileDescriptor) []descriptor.FileDescriptor {
	byPath := make(map[string]descriptor.FileDescriptor, len(fds))
	for _, fd := range fds {
		byPath[fd.ProtoreflectFileDescriptor().Path()] = fd
	}
	out := make([]descriptor.FileDescriptor, 0, len(fds))
	seen := make(map[string]bool, len(fds))
	var visit func(fd descriptor.FileDescriptor)
	visit = func(fd descriptor.FileDescriptor) {
		name := fd.ProtoreflectFileDescriptor().Path()
		if seen[name] {
			return
		}
		seen[name] = true
		for _, dep := range fd.FileDescriptorProto().GetDependency() {
			if d, ok := byPath[dep]; ok {
				visit(d)
			}
		}
		out = append(out, fd)
	}
	for _, fd := range fds {
		visit(fd)
	}
	return out
}

// review runs the design review protoc-gen-saga runs and returns every
// finding, warnings included (a warning of a contract with errors is still
// a finding here), sorted by position.
func (c *contract) review() ([]model.Diagnostic, error) {
	_, err := model.Build(c.plugin, model.Options{WarningsAsErrors: true})
	ds, err := diagnostics(err)
	if err != nil {
		return nil, err
	}
	ds = append(slices.Clone(c.goPackage), ds...)
	for _, d := range ds {
		if !slices.ContainsFunc(model.Rules, func(r model.Rule) bool { return r.ID == d.Rule }) {
			return nil, fmt.Errorf("saga design review: %s reports rule %q, which model.Rules does not list", d.Pos, d.Rule)
		}
	}
	slices.SortStableFunc(ds, func(a, b model.Diagnostic) int {
		return cmp.Or(cmp.Compare(a.Pos.File, b.Pos.File), cmp.Compare(a.Pos.Line, b.Pos.Line),
			cmp.Compare(a.Pos.Col, b.Pos.Col), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Message, b.Message))
	})
	return ds, nil
}

// model builds the contract's model for comparison, also when the review
// refuses the contract (a deployed contract may fail rules added since):
// what resolved is compared, what did not is nil.
func (c *contract) model() (*model.Model, error) {
	m, err := model.Build(c.plugin, model.Options{KeepModel: true})
	if _, derr := diagnostics(err); derr != nil {
		return nil, derr
	}
	return m, nil
}

// diagnostics unpacks the findings model.Build joined into err. An error
// that is not a finding is returned as an error.
func diagnostics(err error) ([]model.Diagnostic, error) {
	if err == nil {
		return nil, nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]model.Diagnostic, 0, len(errs))
	for _, e := range errs {
		var d model.Diagnostic
		if !errors.As(e, &d) {
			return nil, fmt.Errorf("saga design review: %w", e)
		}
		out = append(out, d)
	}
	return out, nil
}

// location returns the annotation option placing a finding at pos in c's
// file.
//
// An annotation carries a source path, not a position: buf (and the
// plugin's client) show the first source location recorded for that path.
// A path is not unique: every option statement of a declaration is recorded
// under the declaration's options path ([4, i, 7] for a message), so for
// `option (saga.v1.message).owner = "stock";` after another option
// statement, that path names the first statement. location names a path
// whose first location starts at pos (the review reports the start of a
// location), the shortest such path when several do: the option statement
// itself, or the path of the option field it sets.
//
// When no path's first location starts at pos (buf starts an option
// literal's own path at the option's name, so an option statement that is
// not its declaration's first has no path of its own), location names the
// earliest location inside the one starting at pos that a path names: the
// option's name on the same line. When no location starts at pos, it
// names the file alone.
func (c *contract) location(pos model.Pos) check.AddAnnotationOption {
	fd := c.files[pos.File]
	if fd == nil {
		return nil
	}
	locs := fd.ProtoreflectFileDescriptor().SourceLocations()
	// named reports whether loc's path names loc: loc is the first
	// location recorded for its path.
	named := func(loc protoreflect.SourceLocation) bool {
		first := locs.ByPath(loc.Path)
		return first.StartLine == loc.StartLine && first.StartColumn == loc.StartColumn &&
			first.EndLine == loc.EndLine && first.EndColumn == loc.EndColumn
	}
	var at, best protoreflect.SourceLocation
	for i := range locs.Len() {
		loc := locs.Get(i)
		if loc.StartLine+1 != pos.Line || loc.StartColumn+1 != pos.Col || len(loc.Path) == 0 {
			continue
		}
		if at.Path == nil || len(loc.Path) < len(at.Path) {
			at = loc
		}
		if named(loc) && (best.Path == nil || len(loc.Path) < len(best.Path)) {
			best = loc
		}
	}
	if best.Path != nil {
		return check.WithFileNameAndSourcePath(pos.File, best.Path)
	}
	if at.Path == nil {
		return check.WithFileName(pos.File)
	}
	for i := range locs.Len() {
		loc := locs.Get(i)
		if len(loc.Path) == 0 || !within(loc, at) || !named(loc) {
			continue
		}
		if best.Path == nil || startsBefore(loc, best) ||
			(!startsBefore(best, loc) && len(loc.Path) < len(best.Path)) {
			best = loc
		}
	}
	if best.Path == nil {
		return check.WithFileName(pos.File)
	}
	return check.WithFileNameAndSourcePath(pos.File, best.Path)
}

// within reports whether inner starts inside outer's span.
func within(inner, outer protoreflect.SourceLocation) bool {
	return !startsBefore(inner, outer) &&
		(inner.StartLine < outer.EndLine || (inner.StartLine == outer.EndLine && inner.StartColumn < outer.EndColumn))
}

// startsBefore reports whether a starts before b.
func startsBefore(a, b protoreflect.SourceLocation) bool {
	return a.StartLine < b.StartLine || (a.StartLine == b.StartLine && a.StartColumn < b.StartColumn)
}

// session computes, once per check request, what the rules of that request
// share: the contracts of both sides, the review of the files and the
// changes between the sides.
type session struct {
	req check.Request

	currentOnce sync.Once
	current     *contract
	currentErr  error

	reviewOnce sync.Once
	findings   []model.Diagnostic
	reviewErr  error

	compareOnce sync.Once
	changes     []change
	compareErr  error
}

type sessionKey struct{}

// before is the spec's Before hook: it attaches a session to ctx.
func before(ctx context.Context, req check.Request) (context.Context, check.Request, error) {
	return context.WithValue(ctx, sessionKey{}, &session{req: req}), req, nil
}

// sessionFor returns the session of ctx, or a new one for req when the
// hook did not run (a rule handler called on its own).
func sessionFor(ctx context.Context, req check.Request) *session {
	if s, ok := ctx.Value(sessionKey{}).(*session); ok && s.req == req {
		return s
	}
	return &session{req: req}
}

// contract returns the request's files as a contract.
func (s *session) contract() (*contract, error) {
	s.currentOnce.Do(func() {
		s.current, s.currentErr = newContract(s.req.FileDescriptors())
	})
	return s.current, s.currentErr
}

// review returns the design review's findings on the request's files.
func (s *session) review() (*contract, []model.Diagnostic, error) {
	c, err := s.contract()
	if err != nil {
		return nil, nil, err
	}
	s.reviewOnce.Do(func() {
		s.findings, s.reviewErr = c.review()
	})
	return c, s.findings, s.reviewErr
}
