package model

import (
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/compiler/protogen"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// Names derives every Go identifier the generator declares. Renderers use
// these functions, never their own string concatenation, so the collision
// review covers exactly what is generated.

// InfoVar is the message's *message.Info variable.
func InfoVar(m *Message) string { return m.Proto.GoIdent.GoName + "Info" }

// PublishFunc is the message's typed outbox publisher.
func PublishFunc(m *Message) string { return "Publish" + m.Proto.GoIdent.GoName }

// ScheduleFunc is the message's typed publisher for later delivery.
func ScheduleFunc(m *Message) string { return "Schedule" + m.Proto.GoIdent.GoName }

// HasPublish reports whether m gets a PublishFunc: commands and events do;
// a reply leaves only through its participant (or ReplyToFunc), which keeps
// the command's causation.
func HasPublish(m *Message) bool { return m.Kind != sagav1.Kind_KIND_REPLY }

// ReplyToFunc answers command m later, from another transaction.
func ReplyToFunc(m *Message) string { return "ReplyTo" + m.Proto.GoIdent.GoName }

// ResultType is a command's sealed result interface.
func ResultType(m *Message) string { return m.Proto.GoIdent.GoName + "Result" }

// ResultMarker is the unexported marker method of ResultType.
func ResultMarker(m *Message) string { return "is" + m.Proto.GoIdent.GoName + "Result" }

// BuildMethod is the decider method building command m.
func BuildMethod(m *Message) string { return "Build" + m.Proto.GoIdent.GoName }

// SkipMethod is the decider method deciding whether conditional step st is
// skipped.
func SkipMethod(st *Step) string { return "Skip" + st.Name }

// FoldMethod is the decider method folding reply or event m into saga data.
func FoldMethod(m *Message) string { return "On" + m.Proto.GoIdent.GoName }

// ParticipantType is a service's participant interface.
func ParticipantType(p *Participant) string { return p.GoName + "Participant" }

// ParticipantFunc adapts a participant's implementation to participant.Func.
func ParticipantFunc(p *Participant) string { return p.GoName + "ParticipantFunc" }

// RegisterFunc registers a participant's handler.
func RegisterFunc(p *Participant) string { return "Register" + p.GoName + "Participant" }

// SubscriberType is a service's subscriber interface for one package's
// events.
func SubscriberType(s *Subscriber) string { return s.GoName + "Subscriber" }

// SubscriberFunc adapts a subscriber's implementation to subscriber.Func.
func SubscriberFunc(s *Subscriber) string { return s.GoName + "SubscriberFunc" }

// RegisterSubscriberFunc registers a subscriber's handler.
func RegisterSubscriberFunc(s *Subscriber) string { return "Register" + s.GoName + "Subscriber" }

// SubscriberQueue is the queue service consumes the events of proto
// package pkg from: "<service>.events.<pkg>".
func SubscriberQueue(service, pkg string) string {
	if pkg == "" {
		return service + ".events"
	}
	return service + ".events." + pkg
}

// Saga-level identifiers.
func (s *Saga) GoName() string         { return s.Name }
func (s *Saga) NewFunc() string        { return "New" + s.Name }
func (s *Saga) RegisterFunc() string   { return "Register" + s.Name }
func (s *Saga) DefinitionFunc() string { return s.Name + "Definition" }
func (s *Saga) DeciderType() string    { return s.Name + "Decider" }
func (s *Saga) NoopFoldsType() string  { return s.Name + "NoopFolds" }
func (s *Saga) HooksType() string      { return Lower(s.Name) + "Hooks" }
func (s *Saga) HooksFunc() string      { return s.Name + "Hooks" }
func (s *Saga) MigrationsFunc() string { return s.Name + "Migrations" }
func (s *Saga) MigrationsVar() string  { return Lower(s.Name) + "MigrationsFS" }
func (s *Saga) StateType() string      { return s.Name + "State" }
func (s *Saga) SnapshotType() string   { return s.Name + "Snapshot" }
func (s *Saga) FilterType() string     { return s.Name + "Filter" }
func (s *Saga) PageType() string       { return s.Name + "Page" }
func (s *Saga) StateConst(state string) string {
	return s.Name + "State" + Camel(Snake(state))
}

// ParticipantQueue is the queue service owner consumes its commands from.
func ParticipantQueue(owner string) string { return owner + ".commands" }

// Package-level identifiers.
const (
	TopologyFunc    = "Topology"
	TopologyPlanVar = "TopologyPlan"
	SagaPackageFunc = "SagaPackage"
)

// Lower returns s with its first letter lower-cased; anything else (a
// digit, '_', an already lower-case letter) is kept as it is.
func Lower(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}

// messageMethods are the methods generated on every annotated message.
var messageMethods = []string{"SagaMessageInfo", "IdempotencyKey", "CorrelationKey"}

// collisions reports generated identifiers that clash with each other or
// with protoc-gen-go's in the same Go package.
func (b *builder) collisions() {
	byPkg := map[protogen.GoImportPath]map[string]string{}
	scope := func(ip protogen.GoImportPath) map[string]string {
		if byPkg[ip] == nil {
			byPkg[ip] = map[string]string{}
		}
		return byPkg[ip]
	}
	// protoc-gen-go's identifiers.
	for _, f := range b.gen.Files {
		if !f.Generate {
			continue
		}
		sc := scope(f.GoImportPath)
		sc["File_"+f.GoDescriptorIdent.GoName] = "protoc-gen-go"
		sc[f.GoDescriptorIdent.GoName] = "protoc-gen-go file descriptor"
		for _, e := range f.Enums {
			addEnum(sc, e)
		}
		for _, x := range f.Extensions {
			sc[x.GoIdent.GoName] = "extension " + string(x.Desc.FullName())
		}
		walkMessages(f.Messages, func(m *protogen.Message) {
			sc[m.GoIdent.GoName] = "message " + string(m.Desc.FullName())
			for _, e := range m.Enums {
				addEnum(sc, e)
			}
			for _, x := range m.Extensions {
				sc[x.GoIdent.GoName] = "extension " + string(x.Desc.FullName())
			}
			for _, o := range m.Oneofs {
				for _, fld := range o.Fields {
					sc[fld.GoIdent.GoName] = "oneof wrapper of field " + string(fld.Desc.FullName())
				}
			}
		})
	}
	claimHint := func(f *protogen.File, p []int32, name, what, hint string) {
		sc := scope(f.GoImportPath)
		if prev, ok := sc[name]; ok {
			b.errorf(f, p, "name-collision", hint,
				"generated Go identifier %s for %s collides with %s", name, what, prev)
			return
		}
		sc[name] = what
	}
	claim := func(f *protogen.File, p []int32, name, what string) {
		claimHint(f, p, name, what, "rename the message, saga or service, or move it to another Go package")
	}
	for _, m := range b.sortedMessages() {
		if !m.Generate {
			continue
		}
		p := path(m.Proto.Location.Path, fieldMessageOptions, extMessage)
		claim(m.File, p, InfoVar(m), "message "+m.FullName)
		if HasPublish(m) {
			claim(m.File, p, PublishFunc(m), "message "+m.FullName)
			claim(m.File, p, ScheduleFunc(m), "message "+m.FullName)
		}
		if m.Kind == sagav1.Kind_KIND_COMMAND && m.Owner != "" {
			claim(m.File, p, ResultType(m), "command "+m.FullName)
			claim(m.File, p, ReplyToFunc(m), "command "+m.FullName)
		}
		for _, fld := range m.Proto.Fields {
			if fld.Oneof != nil && !fld.Oneof.Desc.IsSynthetic() {
				continue // a member of a real oneof is a field of its wrapper type (claimed above)
			}
			for _, meth := range messageMethods {
				if fld.GoName == meth {
					b.errorf(m.File, path(m.Proto.Location.Path, 2, int32(fld.Desc.Index())), "name-collision",
						"rename the field; the generated method "+meth+"() implements runtime/message.Message",
						"field %s becomes Go field %s, which collides with the generated method %s()", fld.Desc.FullName(), fld.GoName, meth)
				}
			}
		}
		for _, o := range m.Proto.Oneofs {
			for _, meth := range messageMethods {
				if o.GoName == meth {
					b.errorf(m.File, m.Proto.Location.Path, "name-collision", "rename the oneof",
						"oneof %s becomes Go field %s, which collides with the generated method %s()", o.Desc.FullName(), o.GoName, meth)
				}
			}
		}
	}
	owners := map[protogen.GoImportPath]map[string]bool{}
	for _, m := range b.sortedMessages() {
		if !m.Generate || m.Kind != sagav1.Kind_KIND_COMMAND || m.Owner == "" {
			continue
		}
		ip := m.File.GoImportPath
		if owners[ip] == nil {
			owners[ip] = map[string]bool{}
		}
		if owners[ip][m.Owner] {
			continue
		}
		owners[ip][m.Owner] = true
		pt := &Participant{GoName: Camel(m.Owner)}
		p := path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgOwner)
		claim(m.File, p, ParticipantType(pt), "service "+m.Owner)
		claim(m.File, p, RegisterFunc(pt), "service "+m.Owner)
		claim(m.File, p, ParticipantFunc(pt), "service "+m.Owner)
	}
	subs := map[protogen.GoImportPath]map[string]bool{}
	for _, m := range b.sortedMessages() {
		if !m.Generate {
			continue
		}
		ip := m.File.GoImportPath
		for i, svc := range m.Subscribers {
			if subs[ip] == nil {
				subs[ip] = map[string]bool{}
			}
			if subs[ip][svc] {
				continue
			}
			subs[ip][svc] = true
			sb := &Subscriber{GoName: Camel(svc)}
			p := path(m.Proto.Location.Path, fieldMessageOptions, extMessage, msgSubscribers, int32(i))
			for _, n := range []string{SubscriberType(sb), SubscriberFunc(sb), RegisterSubscriberFunc(sb)} {
				claim(m.File, p, n, "subscriber "+svc)
			}
		}
	}
	for _, d := range b.sagas {
		if !d.file.Generate {
			continue
		}
		s := d.saga
		if !camelRE.MatchString(s.Name) {
			continue // reported as saga-name
		}
		methods := map[string]string{}
		method := func(name, full string) {
			if prev, ok := methods[name]; ok && prev != full {
				b.errorf(d.file, path(d.base, sagaName), "name-collision", "rename one of the messages; decider methods are named after message names",
					"saga %s: decider method %s would serve both %s and %s", s.FullName, name, prev, full)
				return
			}
			methods[name] = full
		}
		for _, st := range s.Steps {
			for _, c := range []*Message{st.Command, st.Compensation} {
				if c != nil {
					method(BuildMethod(c), c.FullName)
				}
			}
			for _, r := range slices.Concat(st.Success, st.Failure, st.CompensationFailure, []*Message{st.CompensationReply}) {
				if r != nil {
					method(FoldMethod(r), r.FullName)
				}
			}
		}
		if c := s.Cancel; c != nil && c.Message != nil {
			method(FoldMethod(c.Message), c.Message.FullName)
		}
		for _, n := range []string{s.GoName(), s.NewFunc(), s.RegisterFunc(), s.DefinitionFunc(), s.DeciderType(), s.NoopFoldsType(),
			s.HooksType(), s.HooksFunc(), s.MigrationsFunc(), s.MigrationsVar(),
			s.StateType(), s.SnapshotType(), s.FilterType(), s.PageType()} {
			claim(d.file, path(d.base, sagaName), n, "saga "+s.FullName)
		}
		if s.Definition == nil {
			continue // not compiled: reported by another rule
		}
		for _, st := range s.Definition.States {
			p := path(d.base, sagaName)
			if i := slices.IndexFunc(s.Steps, func(x *Step) bool { return x.Name == st.Step }); st.Step != "" && i >= 0 {
				p = path(d.base, sagaSteps, int32(i), stepName)
			}
			claimHint(d.file, p, s.StateConst(st.Name), "state "+st.Name+" of saga "+s.FullName,
				"rename the step (name: \"...\"), the saga or the message; state constants are named <Saga>State<State>")
		}
	}
	claimed := map[protogen.GoImportPath]bool{}
	for _, f := range b.gen.Files {
		if f.Generate && !claimed[f.GoImportPath] && b.annotated(f) {
			claimed[f.GoImportPath] = true
			for _, name := range []string{TopologyFunc, TopologyPlanVar, SagaPackageFunc} {
				// Point at the declaration the user has to rename, when
				// there is one; the package function has no position.
				df, dp := f, []int32(nil)
				if mf, mp, ok := b.messageDecl(f.GoImportPath, name); ok {
					df, dp = mf, mp
				}
				claim(df, dp, name, "the package topology")
			}
		}
	}
}

// messageDecl finds the message whose protoc-gen-go type is named name in
// the Go package importPath, and returns its file and source path.
func (b *builder) messageDecl(importPath protogen.GoImportPath, name string) (*protogen.File, []int32, bool) {
	for _, f := range b.gen.Files {
		if f.GoImportPath != importPath {
			continue
		}
		var found *protogen.Message
		walkMessages(f.Messages, func(m *protogen.Message) {
			if found == nil && m.GoIdent.GoName == name {
				found = m
			}
		})
		if found != nil {
			return f, found.Location.Path, true
		}
	}
	return nil, nil, false
}

// annotated reports whether f declares annotated messages or sagas.
func (b *builder) annotated(f *protogen.File) bool {
	for _, m := range b.messages {
		if m.File == f {
			return true
		}
	}
	for _, d := range b.sagas {
		if d.file == f {
			return true
		}
	}
	return false
}

func addEnum(sc map[string]string, e *protogen.Enum) {
	what := fmt.Sprintf("enum %s", e.Desc.FullName())
	sc[e.GoIdent.GoName] = what
	sc[e.GoIdent.GoName+"_name"] = what
	sc[e.GoIdent.GoName+"_value"] = what
	for _, v := range e.Values {
		sc[v.GoIdent.GoName] = "enum value " + string(v.Desc.FullName())
	}
}
