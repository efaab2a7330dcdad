package golang

import (
	"path"
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
	"github.com/protosaga/saga/runtime/sagadef"
)

// ScenarioTests renders, next to the test helpers of f's sagas (package
// <name>test), each saga's scenarios computed from its graph
// (<saga>.scenarios.go: <Saga>Scenarios and Run<Saga>Scenarios) and a test
// that runs them on stub hooks (<saga>_scenarios_test.go), so `go test`
// checks every contract's sagas with no hand-written test. A team runs
// them with its own decider by calling Run<Saga>Scenarios from a test.
func ScenarioTests(gen *protogen.Plugin, f *model.File) {
	if len(f.Sagas) == 0 {
		return
	}
	ip, name := TestPackage(f)
	dir := path.Join(path.Dir(f.Proto.GeneratedFilenamePrefix), string(name))
	for _, s := range f.Sagas {
		g := gen.NewGeneratedFile(path.Join(dir, s.Snake+".scenarios.go"), ip)
		g.P(Header)
		g.P("// source: ", f.Proto.Desc.Path())
		g.P()
		g.P("package ", name)
		g.P()
		genScenarios(g, s)

		t := gen.NewGeneratedFile(path.Join(dir, s.Snake+"_scenarios_test.go"), ip)
		t.P(Header)
		t.P("// source: ", f.Proto.Desc.Path())
		t.P()
		t.P("package ", name)
		t.P()
		genScenarioTest(t, s)
	}
}

var classIdents = map[sagadef.Class]string{
	sagadef.ClassNew: "ClassNew", sagadef.ClassDuplicate: "ClassDuplicate", sagadef.ClassLate: "ClassLate",
	sagadef.ClassConflicting: "ClassConflicting", sagadef.ClassInvalid: "ClassInvalid", sagadef.ClassEarly: "ClassEarly",
}

func genScenarios(g *protogen.GeneratedFile, s *model.Saga) {
	pkg := s.Data.GoIdent.GoImportPath
	l := sagaLocals(s, pkg)
	t, d, start := l.name("t"), l.name("d"), l.name("start")
	scenario, move := g.QualifiedGoIdent(sagatestPkg.Ident("Scenario")), g.QualifiedGoIdent(sagatestPkg.Ident("Move"))
	g.P("// ", s.Name, "Scenarios returns the scenarios of saga ", s.FullName, ", computed by")
	g.P("// protoc-gen-saga from its steps: the happy path, and for every step a business")
	g.P("// failure (and a failed compensation), its timeouts, a late success reply to its")
	g.P("// first command and a duplicate of its success reply, and for every conditional")
	g.P("// step a path that skips it, each with the state, classification and sent")
	g.P("// messages every move must lead to.")
	g.P("func ", s.Name, "Scenarios() []", scenario, " {")
	g.P("return []", scenario, "{")
	for _, sc := range graphScenarios(s.Definition.Steps) {
		g.P("{")
		g.P("Name: ", strconv.Quote(sc.Name), ",")
		g.P("Moves: []", move, "{")
		for _, m := range sc.Moves {
			fields := []string{"Do: " + g.QualifiedGoIdent(sagatestPkg.Ident(string(m.Do)))}
			if m.Step != "" {
				fields = append(fields, "Step: "+strconv.Quote(m.Step))
			}
			if m.Message != "" {
				fields = append(fields, "Message: "+strconv.Quote(m.Message))
			}
			fields = append(fields, "State: "+strconv.Quote(m.State))
			if m.Do != moveStart {
				fields = append(fields, "Class: "+g.QualifiedGoIdent(sagadefPkg.Ident(classIdents[m.Class])))
			}
			if len(m.Sent) > 0 {
				fields = append(fields, "Sent: "+stringSlice(m.Sent))
			}
			g.P("{", strings.Join(fields, ", "), "},")
		}
		g.P("},")
		g.P("Final: ", strconv.Quote(sc.Final), ",")
		if len(sc.Compensated) > 0 {
			g.P("Compensated: ", stringSlice(sc.Compensated), ",")
		}
		if len(sc.Skipped) > 0 {
			g.P("Skipped: ", stringSlice(sc.Skipped), ",")
		}
		g.P("},")
	}
	g.P("}")
	g.P("}")
	g.P()
	g.P("// Run", s.Name, "Scenarios runs ", s.Name, "Scenarios on the saga with decider ", d, ", each")
	g.P("// scenario beginning with ", start, ", as subtests of ", t, ". Each scenario decides the")
	g.P("// conditional steps it skips; the decider's Skip methods are called and must")
	g.P("// not fail, but their answer is replaced by the scenario's.")
	g.P("func Run", s.Name, "Scenarios(", t, " *", testingPkg.Ident("T"), ", ", d, " ", pkg.Ident(s.DeciderType()), ", ", start, " *", s.Start.Proto.GoIdent, ") {")
	g.P(t, ".Helper()")
	g.P(sagatestPkg.Ident("RunScenarios"), "(", t, ", ", pkg.Ident(s.DefinitionFunc()), ", ", sagatestPkg.Ident("ScenarioEnv"),
		"{Hooks: ", pkg.Ident(s.HooksFunc()), "(", d, "), Start: ", start, "}, ", s.Name, "Scenarios())")
	g.P("}")
}

func genScenarioTest(g *protogen.GeneratedFile, s *model.Saga) {
	pkg := s.Data.GoIdent.GoImportPath
	l := sagaLocals(s, pkg)
	t := l.name("t")
	g.P("// Test", s.Name, "Scenarios runs the scenarios of saga ", s.FullName, " on stub hooks")
	g.P("// (empty saga data and commands): it checks the definition's graph, not a decider.")
	g.P("func Test", s.Name, "Scenarios(", t, " *", testingPkg.Ident("T"), ") {")
	g.P(sagatestPkg.Ident("RunScenarios"), "(", t, ", ", pkg.Ident(s.DefinitionFunc()), ", ", sagatestPkg.Ident("ScenarioEnv"),
		"{Hooks: ", sagatestPkg.Ident("StubHooks"), "(", pkg.Ident(s.DefinitionFunc()), "()), Start: &", s.Start.Proto.GoIdent, "{}}, ", s.Name, "Scenarios())")
	g.P("}")
}
