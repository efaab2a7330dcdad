package golang

import (
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
)

// The code a service's host (runtime/host) runs: the package description
// every registration carries, the participants' and sagas' Register
// functions, and the typed late replies.

// genSagaPackage renders the package's SagaPackage function: its message
// types and its topology, for a host.
func genSagaPackage(g *protogen.GeneratedFile, p *model.Package) {
	var infos []string
	for _, f := range p.Files {
		for _, m := range f.Messages {
			infos = append(infos, model.InfoVar(m))
		}
	}
	g.P("// ", model.SagaPackageFunc, " describes this package's contract for a registrar (runtime/host): its")
	g.P("// message types and its topology (", model.TopologyPlanVar, ").")
	g.P("func ", model.SagaPackageFunc, "() ", servicePkg.Ident("Package"), " {")
	g.P("return ", servicePkg.Ident("Package"), "{")
	g.P("Path: ", strconv.Quote(string(p.ImportPath)), ",")
	g.P("Messages: []*", messagePkg.Ident("Info"), "{", strings.Join(infos, ", "), "},")
	g.P("Topology: ", model.TopologyPlanVar, ".Topology,")
	if len(Topology(p).Retry) > 0 {
		g.P("Retry: ", model.TopologyPlanVar, ".Retry,")
	}
	g.P("}")
	g.P("}")
	g.P()
}

// genParticipantRegister renders Register<Service>Participant.
func genParticipantRegister(g *protogen.GeneratedFile, p *model.Participant) {
	reg := model.RegisterFunc(p)
	g.P("// ", reg, " registers impl on h (a runtime/host Host) as the participant of service ", strconv.Quote(p.Owner), ":")
	g.P("// h consumes ", strconv.Quote(p.Queue), ", runs each command in the consumer's transaction and")
	g.P("// writes its reply to the outbox in it. Each command runs once per type and")
	g.P("// idempotency key: a resend (a saga's retry after a timeout, a duplicate with a")
	g.P("// new message id) gets the first reply again and has no second effect.")
	g.P("func ", reg, "(h ", servicePkg.Ident("Registrar"), ", impl ", model.ParticipantType(p), ") error {")
	g.P("if impl == nil {")
	g.P("return h.Fail(", errorsPkg.Ident("New"), "(", strconv.Quote("service "+p.Owner+": participant is nil"), "))")
	g.P("}")
	g.P("return h.AddParticipant(", servicePkg.Ident("Participant"), "{")
	g.P("Service: ", strconv.Quote(p.Owner), ",")
	g.P("Queue: ", strconv.Quote(p.Queue), ",")
	g.P("Package: ", model.SagaPackageFunc, "(),")
	g.P("Func: ", model.ParticipantFunc(p), "(impl),")
	g.P("})")
	g.P("}")
	g.P()
}

// genSubscriberRegister renders Register<Service>Subscriber.
func genSubscriberRegister(g *protogen.GeneratedFile, sb *model.Subscriber) {
	reg := model.RegisterSubscriberFunc(sb)
	g.P("// ", reg, " registers impl on h (a runtime/host Host) as the subscriber of service ", strconv.Quote(sb.Service), ":")
	g.P("// h consumes ", strconv.Quote(sb.Queue), ", bound to the events it subscribes to, and runs")
	g.P("// each event once per message id in the consumer's transaction.")
	g.P("func ", reg, "(h ", servicePkg.Ident("Registrar"), ", impl ", model.SubscriberType(sb), ") error {")
	g.P("if impl == nil {")
	g.P("return h.Fail(", errorsPkg.Ident("New"), "(", strconv.Quote("service "+sb.Service+": subscriber is nil"), "))")
	g.P("}")
	g.P("return h.AddSubscriber(", servicePkg.Ident("Subscriber"), "{")
	g.P("Service: ", strconv.Quote(sb.Service), ",")
	g.P("Queue: ", strconv.Quote(sb.Queue), ",")
	g.P("Package: ", model.SagaPackageFunc, "(),")
	g.P("Func: ", model.SubscriberFunc(sb), "(impl),")
	g.P("})")
	g.P("}")
	g.P()
}

// genSagaRegister renders Register<Saga>.
func genSagaRegister(g *protogen.GeneratedFile, s *model.Saga) {
	l := sagaLocals(s)
	typ := s.GoName()
	h, d, sg, err := l.name("h"), l.name("d"), l.name("s"), l.name("err")
	g.P("// ", s.RegisterFunc(), " registers saga ", s.FullName, " with decider ", d, " on ", h, " (a runtime/host Host), which migrates its")
	g.P("// table, consumes ", strconv.Quote(s.Queue), ", runs its timeout scanner and serves its status")
	g.P("// at /sagas/", s.Snake, "/{id}. Use the returned saga to start and read instances.")
	g.P("func ", s.RegisterFunc(), "(", h, " ", servicePkg.Ident("Registrar"), ", ", d, " ", s.DeciderType(), ") (*", typ, ", error) {")
	g.P(sg, ", ", err, " := ", s.NewFunc(), "(", h, ".SagaConfig(", strconv.Quote(s.FullName), "), ", d, ")")
	g.P("if ", err, " != nil {")
	g.P("return nil, ", h, ".Fail(", err, ")")
	g.P("}")
	g.P("if ", err, " := ", h, ".AddSaga(", servicePkg.Ident("Saga"), "{")
	g.P("Engine: ", sg, ".engine,")
	g.P("Queue: ", strconv.Quote(s.Queue), ",")
	g.P("Snake: ", strconv.Quote(s.Snake), ",")
	g.P("Package: ", model.SagaPackageFunc, "(),")
	g.P("Migrations: ", s.MigrationsFunc(), "(),")
	g.P("NewStart: func() ", messagePkg.Ident("Message"), " { return new(", s.Start.Proto.GoIdent, ") },")
	g.P("}); ", err, " != nil {")
	g.P("return nil, ", err)
	g.P("}")
	g.P("return ", sg, ", nil")
	g.P("}")
	g.P()
}

// genReplyTo renders ReplyTo<Command> for a command with replies: the one
// way to answer it later, from another transaction.
func genReplyTo(g *protogen.GeneratedFile, m *model.Message) {
	name := m.Proto.GoIdent.GoName
	fn := model.ReplyToFunc(m)
	g.P("// ", fn, " answers command ", name, " after its participant returned participant.ErrReplyLater,")
	g.P("// from another transaction: p is what participant.Later returned while handling it.")
	g.P("// The reply goes to the outbox in tx and continues the command's conversation")
	g.P("// (causation = the command's message id), so the saga matches it to the attempt it answers.")
	g.P("func ", fn, "(ctx ", contextPkg.Ident("Context"), ", tx ", pgxPkg.Ident("Tx"), ", p ", participantPkg.Ident("Pending"),
		", reply ", model.ResultType(m), ") error {")
	g.P("return ", participantPkg.Ident("ReplyLater"), "(ctx, tx, p, ", strconv.Quote(m.FullName), ", reply)")
	g.P("}")
	g.P()
}
