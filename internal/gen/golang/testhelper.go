package golang

import (
	"path"
	"strconv"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
)

const (
	sagatestPkg = protogen.GoImportPath(runtimeRoot + "sagatest")
	testingPkg  = protogen.GoImportPath("testing")
)

// TestPackage returns the import path and name of the package holding the
// in-memory test helpers of f's Go package: "<import path>/<name>test". The
// helpers live apart so production code importing the contract package
// does not link package testing.
func TestPackage(f *model.File) (protogen.GoImportPath, protogen.GoPackageName) {
	name := f.Proto.GoPackageName + "test"
	return protogen.GoImportPath(path.Join(string(f.Proto.GoImportPath), string(name))), name
}

// TestHelpers renders the typed sagatest harness of every saga in f, or
// nothing when f declares no saga.
func TestHelpers(gen *protogen.Plugin, f *model.File) {
	if len(f.Sagas) == 0 {
		return
	}
	ip, name := TestPackage(f)
	prefix := f.Proto.GeneratedFilenamePrefix
	filename := path.Join(path.Dir(prefix), string(name), path.Base(prefix)+".sagatest.go")
	g := gen.NewGeneratedFile(filename, ip)
	g.P(Header)
	g.P("// source: ", f.Proto.Desc.Path())
	g.P()
	g.P("// Package ", name, " drives the sagas of package ", f.Proto.GoPackageName, " in memory, without")
	g.P("// a database or a broker, through scripted replies, timeouts and duplicates.")
	g.P("package ", name)
	g.P()
	v := fileSupportVersion(f)
	g.P("// This file needs a runtime that supports generated code version ", v, ".")
	g.P("const _ = ", messagePkg.Ident("SupportPackageIsVersion"+strconv.Itoa(v)))
	g.P()
	for _, s := range f.Sagas {
		genTestHelper(g, s)
	}
}

func genTestHelper(g *protogen.GeneratedFile, s *model.Saga) {
	pkg := s.Data.GoIdent.GoImportPath
	l := sagaLocals(s, pkg)
	t, d, h, m, start := l.name("t"), l.name("d"), l.name("h"), l.name("m"), l.name("start")
	to, reason, state, msg := l.name("to"), l.name("reason"), l.name("state"), l.name("msg")
	typ := s.Name
	st := g.QualifiedGoIdent(pkg.Ident(s.StateType()))
	result := g.QualifiedGoIdent(sagadefPkg.Ident("Result"))
	g.P("// ", typ, " drives one instance of saga ", s.FullName, " in memory. The")
	g.P("// embedded harness delivers replies (Reply, ReplyTo, Duplicate), fires")
	g.P("// timeouts and the deadline, applies operator actions (OperatorRetry,")
	g.P("// OperatorCompensate, OperatorCancel, Resolve) and asserts states and sent")
	g.P("// messages; the methods below take the saga's own types.")
	g.P("type ", typ, " struct {")
	g.P("*", sagatestPkg.Ident("Harness"))
	g.P("tb ", testingPkg.Ident("TB"))
	g.P("}")
	g.P()
	g.P("// New", typ, " returns a harness for the saga with decider d.")
	g.P("func New", typ, "(", t, " ", testingPkg.Ident("TB"), ", ", d, " ", pkg.Ident(s.DeciderType()), ") *", typ, " {")
	g.P(t, ".Helper()")
	g.P("return &", typ, "{Harness: ", sagatestPkg.Ident("New"), "(", t, ", ", pkg.Ident(s.DefinitionFunc()), "(), ", pkg.Ident(s.HooksFunc()), "(", d, ")), tb: ", t, "}")
	g.P("}")
	g.P()
	g.P("// Begin starts the instance from a typed start message.")
	g.P("func (", h, " *", typ, ") Begin(", start, " *", s.Start.Proto.GoIdent, ") ", result, " { return ", h, ".Start(", start, ") }")
	g.P()
	g.P("// Data returns the instance's saga data.")
	g.P("func (", h, " *", typ, ") Data() *", s.Data.GoIdent, " {")
	g.P(d, ", _ := ", h, ".Instance().Data.(*", s.Data.GoIdent, ")")
	g.P("return ", d)
	g.P("}")
	g.P()
	g.P("// State returns the instance's state.")
	g.P("func (", h, " *", typ, ") State() ", st, " {")
	g.P("return ", st, "(", h, ".Instance().State)")
	g.P("}")
	g.P()
	g.P("// RequireState fails the test unless the instance is in ", state, ".")
	g.P("func (", h, " *", typ, ") RequireState(", state, " ", st, ") {")
	g.P(h, ".tb.Helper()")
	g.P(h, ".Harness.RequireState(string(", state, "))")
	g.P("}")
	g.P()
	g.P("// Resolve applies an operator's resolve of manual review to the terminal")
	g.P("// state ", to, ", with the given reason.")
	g.P("func (", h, " *", typ, ") Resolve(", to, " ", st, ", ", reason, " string) ", result, " {")
	g.P(h, ".tb.Helper()")
	g.P("return ", h, ".Harness.Resolve(string(", to, "), ", reason, ")")
	g.P("}")
	g.P()
	if c := s.Cancel; c != nil {
		g.P("// Cancel delivers the business cancel ", msg, " (", c.Message.FullName, "): before the")
		g.P("// point of no return the saga compensates and ends CANCELLED.")
		g.P("func (", h, " *", typ, ") Cancel(", msg, " *", c.Message.Proto.GoIdent, ") ", result, " {")
		g.P(h, ".tb.Helper()")
		g.P("return ", h, ".Harness.Cancel(", msg, ")")
		g.P("}")
		g.P()
	}
	for _, c := range s.Commands {
		name := "Sent" + c.Proto.GoIdent.GoName
		g.P("// ", name, " returns the last ", c.FullName, " the saga sent; it fails the test when none was sent.")
		g.P("func (", h, " *", typ, ") ", name, "() *", c.Proto.GoIdent, " {")
		g.P(m, ", _ := ", h, ".LastSent(", strconv.Quote(c.FullName), ").Message.(*", c.Proto.GoIdent, ")")
		g.P("return ", m)
		g.P("}")
		g.P()
	}
}
