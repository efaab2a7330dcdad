package golang

import (
	"path"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
)

func genSaga(g *protogen.GeneratedFile, s *model.Saga, migrations []string) {
	l := sagaLocals(s)
	genDefinition(g, s, l)
	genDecider(g, s, l)
	genHooks(g, s, l)
	genWrapper(g, s, l)
	genMigrations(g, s, migrations)
}

func genDefinition(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	d := s.Definition
	st, recv := s.StateType(), l.name("s")
	g.P("// ", st, " is a state of saga ", s.FullName, ", as stored in ", s.Table, ".state.")
	g.P("type ", st, " string")
	g.P()
	g.P("// States of saga ", s.FullName, ".")
	g.P("const (")
	for _, state := range d.States {
		g.P(s.StateConst(state.Name), " ", st, " = ", strconv.Quote(state.Name))
	}
	g.P(")")
	g.P()
	g.P("// Terminal reports whether ", recv, " is a terminal state: COMPLETED, FAILED or CANCELLED.")
	g.P("func (", recv, " ", st, ") Terminal() bool { return ", sagadefPkg.Ident("IsTerminal"), "(string(", recv, ")) }")
	g.P()
	g.P("// Valid reports whether ", recv, " is a state of saga ", s.FullName, ".")
	g.P("func (", recv, " ", st, ") Valid() bool {")
	g.P("switch ", recv, " {")
	for i, state := range d.States {
		switch {
		case len(d.States) == 1:
			g.P("case ", s.StateConst(state.Name), ":")
		case i == 0:
			g.P("case ", s.StateConst(state.Name), ",")
		case i == len(d.States)-1:
			g.P(s.StateConst(state.Name), ":")
		default:
			g.P(s.StateConst(state.Name), ",")
		}
	}
	g.P("return true")
	g.P("}")
	g.P("return false")
	g.P("}")
	g.P()
	fn := s.DefinitionFunc()
	g.P("// ", fn, " returns the definition of saga ", s.FullName, ".")
	g.P("//")
	g.P("// States and Transitions are the table sagadef.Compile computed when this")
	g.P("// file was generated; New", s.Name, " compiles the definition again and refuses")
	g.P("// to run when the runtime computes a different table (regenerate then).")
	g.P("func ", fn, "() *", sagadefPkg.Ident("Definition"), " {")
	g.P("return &", sagadefPkg.Ident("Definition"), "{")
	g.P("Name: ", strconv.Quote(d.Name), ",")
	g.P("Table: ", strconv.Quote(d.Table), ",")
	g.P("StartMessage: ", strconv.Quote(d.StartMessage), ",")
	g.P("DataMessage: ", strconv.Quote(d.DataMessage), ",")
	if d.Deadline > 0 {
		g.P("Deadline: ", goDuration(g, d.Deadline), ",")
	}
	g.P("Steps: []", sagadefPkg.Ident("Step"), "{")
	for _, st := range d.Steps {
		g.P("{")
		g.P("Name: ", strconv.Quote(st.Name), ",")
		g.P("Role: ", sdIdent(g, roleNames, st.Role), ",")
		if st.Command != "" {
			g.P("Command: ", strconv.Quote(st.Command), ",")
		}
		if st.External {
			g.P("External: true,")
		}
		if st.Conditional {
			g.P("Conditional: true,")
		}
		if st.Group != "" {
			g.P("Group: ", strconv.Quote(st.Group), ",")
		}
		if st.Child != "" {
			g.P("Child: ", strconv.Quote(st.Child), ",")
		}
		if st.ChildReview != "" {
			g.P("ChildReview: ", strconv.Quote(st.ChildReview), ",")
		}
		g.P("SuccessReplies: ", stringSlice(st.SuccessReplies), ",")
		if len(st.FailureReplies) > 0 {
			g.P("FailureReplies: ", stringSlice(st.FailureReplies), ",")
		}
		if st.Compensation != "" {
			g.P("Compensation: ", strconv.Quote(st.Compensation), ",")
			g.P("CompensationReply: ", strconv.Quote(st.CompensationReply), ",")
		}
		if len(st.CompensationFailureReplies) > 0 {
			g.P("CompensationFailureReplies: ", stringSlice(st.CompensationFailureReplies), ",")
		}
		g.P("Timeout: ", goDuration(g, st.Timeout), ",")
		g.P("OnTimeout: ", sdIdent(g, timeoutNames, st.OnTimeout), ",")
		g.P("MaxAttempts: ", st.MaxAttempts, ",")
		g.P("Late: ", sdIdent(g, lateNames, st.Late), ",")
		g.P("},")
	}
	g.P("},")
	if len(d.Groups) > 0 {
		g.P("Groups: []", sagadefPkg.Ident("Group"), "{")
		for _, gr := range d.Groups {
			g.P("{Name: ", strconv.Quote(gr.Name), ", Timeout: ", goDuration(g, gr.Timeout), "},")
		}
		g.P("},")
	}
	if c := d.Cancel; c.Message != "" {
		g.P("Cancel: ", sagadefPkg.Ident("Cancel"), "{Message: ", strconv.Quote(c.Message), ", RequestedBy: ", strconv.Quote(c.RequestedBy),
			", Reason: ", strconv.Quote(c.Reason), "},")
	}
	if c := d.Callback; c.Declared() {
		g.P("Callback: ", sagadefPkg.Ident("Callback"), "{States: ", stringSlice(c.States), ", URLField: ", strconv.Quote(c.URLField),
			", ClientField: ", strconv.Quote(c.ClientField), ", IncludeData: ", c.IncludeData, "},")
	}
	if r := d.Replies; r.Declared() {
		more := ""
		if r.Cancelled != "" {
			more += ", Cancelled: " + strconv.Quote(r.Cancelled)
		}
		if r.ManualReview != "" {
			more += ", ManualReview: " + strconv.Quote(r.ManualReview)
		}
		g.P("Replies: ", sagadefPkg.Ident("Replies"), "{Completed: ", strconv.Quote(r.Completed), ", Failed: ", strconv.Quote(r.Failed), more, "},")
	}
	g.P("States: []", sagadefPkg.Ident("State"), "{")
	for _, st := range d.States {
		step := ""
		if st.Step != "" {
			step = ", Step: " + strconv.Quote(st.Step)
		}
		if st.Group != "" {
			step = ", Group: " + strconv.Quote(st.Group)
		}
		g.P("{Name: ", strconv.Quote(st.Name), ", Kind: ", sdIdent(g, stateKindNames, st.Kind), step, "},")
	}
	g.P("},")
	g.P("Transitions: []", sagadefPkg.Ident("Transition"), "{")
	for _, t := range d.Transitions {
		emits := ""
		if t.Emits != nil {
			emits = ", Emits: " + stringSlice(t.Emits)
			if len(t.Emits) == 0 {
				emits = ", Emits: []string{}"
			}
		}
		g.P("{From: ", strconv.Quote(t.From), ", Trigger: ", strconv.Quote(t.Trigger), ", To: ", strconv.Quote(t.To), emits, "},")
	}
	g.P("},")
	g.P("}")
	g.P("}")
	g.P()
}

// decider methods

func buildMethod(m *model.Message) string { return model.BuildMethod(m) }
func foldMethod(m *model.Message) string  { return model.FoldMethod(m) }

func genDecider(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	data := s.Data.GoIdent
	ctx, start, dataVar, msg := l.name("ctx"), l.name("start"), l.name("data"), l.name("msg")
	typ := s.DeciderType()
	g.P("// ", typ, " holds the business decisions of saga ", s.FullName, ":")
	g.P("// the saga data a start message begins with, each command built from the")
	g.P("// saga data, and (optionally) replies folded into the saga data. Sequencing,")
	g.P("// timeouts, retries and compensation are the runtime's. Embed ", s.NoopFoldsType())
	g.P("// to implement only the On methods you need.")
	g.P("type ", typ, " interface {")
	g.P("// Start returns the saga data for a new instance.")
	g.P("Start(", ctx, " ", contextPkg.Ident("Context"), ", ", start, " *", s.Start.Proto.GoIdent, ") (*", data, ", error)")
	for _, c := range s.Commands {
		g.P("// ", buildMethod(c), " builds the command ", c.FullName, " from the saga data.")
		g.P(buildMethod(c), "(", ctx, " ", contextPkg.Ident("Context"), ", ", dataVar, " *", data, ") (*", c.Proto.GoIdent, ", error)")
	}
	for _, st := range s.Steps {
		if st.Conditional {
			g.P("// ", model.SkipMethod(st), " decides, from the saga data, whether conditional step ", st.Name)
			g.P("// is skipped (true), and why (recorded in the saga's audit trail).")
			g.P(model.SkipMethod(st), "(", ctx, " ", contextPkg.Ident("Context"), ", ", dataVar, " *", data, ") (bool, string, error)")
		}
	}
	for _, r := range s.Handles {
		g.P("// ", foldMethod(r), " folds ", r.FullName, " into the saga data before the transition.")
		g.P(foldMethod(r), "(", ctx, " ", contextPkg.Ident("Context"), ", ", dataVar, " *", data, ", ", msg, " *", r.Proto.GoIdent, ") error")
	}
	g.P("}")
	g.P()
	noop := s.NoopFoldsType()
	g.P("// ", noop, " implements every On method of ", typ, " as a no-op.")
	g.P("type ", noop, " struct{}")
	g.P()
	for _, r := range s.Handles {
		g.P("// ", foldMethod(r), " does nothing.")
		g.P("func (", noop, ") ", foldMethod(r), "(", contextPkg.Ident("Context"), ", *", data, ", *", r.Proto.GoIdent, ") error { return nil }")
		g.P()
	}
}

func genHooks(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	typ := s.HooksType()
	data := s.Data.GoIdent
	h, d, ctx, start, dataVar, msg := l.name("h"), l.name("d"), l.name("ctx"), l.name("start"), l.name("data"), l.name("msg")
	m, ok, err := l.name("m"), l.name("ok"), l.name("err")
	errf := func(format string, args ...string) string {
		return g.QualifiedGoIdent(fmtPkg.Ident("Errorf")) + "(" + strconv.Quote("saga "+s.FullName+": "+format) + joinArgs(args) + ")"
	}
	g.P("// ", s.HooksFunc(), " adapts d to the runtime's sagadef.Hooks (", s.NewFunc(), " does this for")
	g.P("// you; use it to drive the definition directly, e.g. with runtime/sagatest).")
	g.P("func ", s.HooksFunc(), "(", d, " ", s.DeciderType(), ") ", sagadefPkg.Ident("Hooks"), " { return ", typ, "{d: ", d, "} }")
	g.P()
	g.P("// ", typ, " adapts a ", s.DeciderType(), " to sagadef.Hooks.")
	g.P("type ", typ, " struct{ d ", s.DeciderType(), " }")
	g.P()
	g.P("func (", h, " ", typ, ") Start(", ctx, " ", contextPkg.Ident("Context"), ", ", start, " ", messagePkg.Ident("Message"), ") (", protoPkg.Ident("Message"), ", string, error) {")
	g.P(m, ", ", ok, " := ", start, ".(*", s.Start.Proto.GoIdent, ")")
	g.P("if !", ok, " {")
	g.P(`return nil, "", `, errf("start message is %T, want *"+s.Start.Proto.GoIdent.GoName, start))
	g.P("}")
	g.P(dataVar, ", ", err, " := ", h, ".d.Start(", ctx, ", ", m, ")")
	g.P("if ", err, " != nil {")
	g.P(`return nil, "", `, err)
	g.P("}")
	g.P("if ", dataVar, " == nil {")
	g.P(`return nil, "", `, errf("Start returned no saga data"))
	g.P("}")
	g.P("return ", dataVar, ", ", keyExpr(g, m, s.BusinessKey, false), ", nil")
	g.P("}")
	g.P()
	command := l.name("command")
	g.P("func (", h, " ", typ, ") Build(", ctx, " ", contextPkg.Ident("Context"), ", ", command, " string, ", dataVar, " ", protoPkg.Ident("Message"), ") (", messagePkg.Ident("Message"), ", error) {")
	if len(s.Commands) == 0 {
		g.P("return nil, ", errf("no command %s in this saga (it sends none)", command))
		g.P("}")
		g.P()
	} else {
		genBuild(g, s, l, errf)
	}
	g.P("func (", h, " ", typ, ") Apply(", ctx, " ", contextPkg.Ident("Context"), ", ", dataVar, " ", protoPkg.Ident("Message"), ", ", msg, " ", messagePkg.Ident("Message"), ") error {")
	g.P(d, ", ", ok, " := ", dataVar, ".(*", data, ")")
	g.P("if !", ok, " {")
	g.P("return ", errf("saga data is %T, want *"+data.GoName, dataVar))
	g.P("}")
	g.P("switch ", m, " := ", msg, ".(type) {")
	for _, r := range s.Handles {
		g.P("case *", r.Proto.GoIdent, ":")
		g.P("return ", h, ".d.", foldMethod(r), "(", ctx, ", ", d, ", ", m, ")")
	}
	g.P("}")
	g.P("return nil")
	g.P("}")
	g.P()
	genSkip(g, s, l, errf)
}

// genSkip implements sagadef.Skipper for a saga with conditional steps.
func genSkip(g *protogen.GeneratedFile, s *model.Saga, l locals, errf func(string, ...string) string) {
	if !slices.ContainsFunc(s.Steps, func(st *model.Step) bool { return st.Conditional }) {
		return
	}
	typ, data := s.HooksType(), s.Data.GoIdent
	h, d, ctx, step, dataVar, ok := l.name("h"), l.name("d"), l.name("ctx"), l.name("step"), l.name("data"), l.name("ok")
	g.P("func (", h, " ", typ, ") Skip(", ctx, " ", contextPkg.Ident("Context"), ", ", step, " string, ", dataVar, " ", protoPkg.Ident("Message"), ") (bool, string, error) {")
	g.P(d, ", ", ok, " := ", dataVar, ".(*", data, ")")
	g.P("if !", ok, " {")
	g.P(`return false, "", `, errf("saga data is %T, want *"+data.GoName, dataVar))
	g.P("}")
	g.P("switch ", step, " {")
	for _, st := range s.Steps {
		if st.Conditional {
			g.P("case ", strconv.Quote(st.Name), ":")
			g.P("return ", h, ".d.", model.SkipMethod(st), "(", ctx, ", ", d, ")")
		}
	}
	g.P("}")
	g.P(`return false, "", `, errf("step %s is not conditional", step))
	g.P("}")
	g.P()
}

func joinArgs(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return ", " + strings.Join(args, ", ")
}

func genWrapper(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	typ := s.GoName()
	start := s.Start.Proto.GoIdent
	recv, cfg, d, def, err, reg, e := l.name("s"), l.name("cfg"), l.name("d"), l.name("def"), l.name("err"), l.name("reg"), l.name("e")
	ctx, tx, startVar, meta, sagaID, created := l.name("ctx"), l.name("tx"), l.name("start"), l.name("meta"), l.name("sagaID"), l.name("created")
	g.P("// ", typ, " runs saga ", s.FullName, " on a *saga.Engine with typed methods.")
	g.P("// Its queue is ", strconv.Quote(s.Queue), "; ", s.RegisterFunc(), " runs it on a host.")
	g.P("type ", typ, " struct {")
	g.P("engine *", sagaPkg.Ident("Engine"))
	g.P("}")
	g.P()
	g.P("// ", s.NewFunc(), " returns the saga over cfg with decider d. It sets cfg.Definition")
	g.P("// and cfg.Hooks, and cfg.Registry and cfg.NewData when they are nil.")
	g.P("func ", s.NewFunc(), "(", cfg, " ", sagaPkg.Ident("Config"), ", ", d, " ", s.DeciderType(), ") (*", typ, ", error) {")
	g.P("if ", d, " == nil {")
	g.P("return nil, ", errorsPkg.Ident("New"), "(", strconv.Quote("saga "+s.FullName+": decider is nil"), ")")
	g.P("}")
	wrapErr := func() {
		g.P("return nil, ", fmtPkg.Ident("Errorf"), "(", strconv.Quote("saga "+s.FullName+": %w"), ", ", err, ")")
	}
	g.P(def, " := ", s.DefinitionFunc(), "()")
	g.P("if ", err, " := ", def, ".CompileGenerated(); ", err, " != nil {")
	wrapErr()
	g.P("}")
	g.P(cfg, ".Definition = ", def)
	g.P(cfg, ".Hooks = ", s.HooksType(), "{d: ", d, "}")
	g.P("if ", cfg, ".Registry == nil {")
	infos := []string{g.QualifiedGoIdent(infoIdent(s.Start))}
	for _, m := range msgUnion(s.Commands, s.Handles) {
		if m != s.Start {
			infos = append(infos, g.QualifiedGoIdent(infoIdent(m)))
		}
	}
	g.P(reg, ", ", err, " := ", messagePkg.Ident("NewRegistry"), "(", strings.Join(infos, ", "), ")")
	g.P("if ", err, " != nil {")
	wrapErr()
	g.P("}")
	g.P(cfg, ".Registry = ", reg)
	g.P("}")
	g.P("if ", cfg, ".NewData == nil {")
	g.P(cfg, ".NewData = func() ", protoPkg.Ident("Message"), " { return new(", s.Data.GoIdent, ") }")
	g.P("}")
	g.P(e, ", ", err, " := ", sagaPkg.Ident("New"), "(", cfg, ")")
	g.P("if ", err, " != nil {")
	g.P("return nil, ", err)
	g.P("}")
	g.P("return &", typ, "{engine: ", e, "}, nil")
	g.P("}")
	g.P()
	g.P("// Engine returns the underlying engine (timeouts, operator actions).")
	g.P("func (", recv, " *", typ, ") Engine() *", sagaPkg.Ident("Engine"), " { return ", recv, ".engine }")
	g.P()
	g.P("// Queue returns the queue the saga consumes its replies and events from, and")
	g.P("// its start message unless a participant owns it.")
	g.P("func (", recv, " *", typ, ") Queue() string { return ", strconv.Quote(s.Queue), " }")
	g.P()
	results := " (" + sagaID + " string, " + created + " bool, " + err + " error)"
	g.P("// StartTx starts an instance in the caller's transaction. It is idempotent on")
	g.P("// the business key ", s.BusinessKey.Path, ": a second start returns the same saga id with created=false.")
	g.P("func (", recv, " *", typ, ") StartTx(", ctx, " ", contextPkg.Ident("Context"), ", ", tx, " ", pgxPkg.Ident("Tx"), ", ", startVar, " *", start,
		", ", meta, " ", messagePkg.Ident("Meta"), ")", results, " {")
	g.P("return ", recv, ".engine.StartTx(", ctx, ", ", tx, ", ", startVar, ", ", meta, ")")
	g.P("}")
	g.P()
	g.P("// Start is StartTx in a transaction of its own.")
	g.P("func (", recv, " *", typ, ") Start(", ctx, " ", contextPkg.Ident("Context"), ", ", startVar, " *", start,
		", ", meta, " ", messagePkg.Ident("Meta"), ")", results, " {")
	g.P("return ", recv, ".engine.Start(", ctx, ", ", startVar, ", ", meta, ")")
	g.P("}")
	g.P()
	g.P("// Status returns the runtime's view of instance sagaID (progress included);")
	g.P("// Get and GetByID return the typed snapshot.")
	g.P("func (", recv, " *", typ, ") Status(", ctx, " ", contextPkg.Ident("Context"), ", ", sagaID, " string) (", sagaPkg.Ident("Status"), ", error) {")
	g.P("return ", recv, ".engine.Status(", ctx, ", ", sagaID, ")")
	g.P("}")
	g.P()
	genReads(g, s, l)
	genHTTP(g, s, l)
	if s.Cancel != nil {
		genCancel(g, s, l)
	}
}

// genReads renders the typed reads: snapshot, filter and page types and
// Get, GetByID and List over the runtime's generic helpers.
func genReads(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	typ, st, data := s.GoName(), s.StateType(), g.QualifiedGoIdent(s.Data.GoIdent)
	recv, ctx, key, sagaID, f := l.name("s"), l.name("ctx"), l.name("businessKey"), l.name("sagaID"), l.name("f")
	params := "[" + st + ", *" + data + "]"
	g.P("// ", s.SnapshotType(), " is one instance of saga ", s.FullName, " as Get, GetByID and List")
	g.P("// return it: its typed state and saga data, version, timestamps and errors.")
	g.P("type ", s.SnapshotType(), " = ", sagaPkg.Ident("Snapshot"), params)
	g.P()
	g.P("// ", s.FilterType(), " selects the instances List returns: by state, by the time")
	g.P("// of their last change, a page at a time.")
	g.P("type ", s.FilterType(), " = ", sagaPkg.Ident("Filter"), "[", st, "]")
	g.P()
	g.P("// ", s.PageType(), " is one page of List, newest first; its NextCursor continues it.")
	g.P("type ", s.PageType(), " = ", sagaPkg.Ident("Page"), params)
	g.P()
	ctxType := g.QualifiedGoIdent(contextPkg.Ident("Context"))
	g.P("// Get returns the instance with business key ", key, " (", s.BusinessKey.Path, " of the start")
	g.P("// message); an error matching saga.ErrNotFound when there is none.")
	g.P("func (", recv, " *", typ, ") Get(", ctx, " ", ctxType, ", ", key, " string) (*", s.SnapshotType(), ", error) {")
	g.P("return ", sagaPkg.Ident("Get"), params, "(", ctx, ", ", recv, ".engine, ", key, ")")
	g.P("}")
	g.P()
	g.P("// GetByID returns the instance with saga id ", sagaID, "; an error matching")
	g.P("// saga.ErrNotFound when there is none.")
	g.P("func (", recv, " *", typ, ") GetByID(", ctx, " ", ctxType, ", ", sagaID, " string) (*", s.SnapshotType(), ", error) {")
	g.P("return ", sagaPkg.Ident("GetByID"), params, "(", ctx, ", ", recv, ".engine, ", sagaID, ")")
	g.P("}")
	g.P()
	g.P("// List returns a page of the instances ", f, " selects, newest first (see saga.Engine.List).")
	g.P("func (", recv, " *", typ, ") List(", ctx, " ", ctxType, ", ", f, " ", s.FilterType(), ") (", s.PageType(), ", error) {")
	g.P("return ", sagaPkg.Ident("List"), params, "(", ctx, ", ", recv, ".engine, ", f, ")")
	g.P("}")
	g.P()
}

// genHTTP renders the start and status handlers and the routes a host
// mounts them at.
func genHTTP(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	typ, start := s.GoName(), s.Start.Proto.GoIdent
	recv, sagaID, statusURL := l.name("s"), l.name("sagaID"), l.name("statusURL")
	base := "/sagas/" + s.Snake
	g.P("// StartPattern is the http.ServeMux pattern HTTPHandler is mounted at.")
	g.P("func (", recv, " *", typ, ") StartPattern() string { return ", strconv.Quote("POST "+base), " }")
	g.P()
	g.P("// StatusPattern is the http.ServeMux pattern StatusHandler is mounted at.")
	g.P("func (", recv, " *", typ, ") StatusPattern() string { return ", strconv.Quote("GET "+base+"/{id}"), " }")
	g.P()
	g.P("// StatusPath is the path StatusPattern matches for instance ", sagaID, ".")
	g.P("func (", recv, " *", typ, ") StatusPath(", sagaID, " string) string { return ", strconv.Quote(base+"/"), " + ", sagaID, " }")
	g.P()
	g.P("// HTTPHandler returns a handler that starts the saga from a POSTed JSON")
	g.P("// (protojson) ", start.GoName, " and answers 202 Accepted with the saga id and")
	g.P("// ", statusURL, "(sagaID) (StatusPath when ", statusURL, " is nil), without waiting for")
	g.P("// any step. The W3C trace context of the request continues in the saga's")
	g.P("// messages. Failures the client did not cause are answered with a reference")
	g.P("// to the log line that records them, never with their text.")
	g.P("func (", recv, " *", typ, ") HTTPHandler(", statusURL, " func(", sagaID, " string) string) ", httpPkg.Ident("Handler"), " {")
	g.P("if ", statusURL, " == nil {")
	g.P(statusURL, " = ", recv, ".StatusPath")
	g.P("}")
	g.P("return ", recv, ".engine.StartHandler(func() ", messagePkg.Ident("Message"), " { return new(", start, ") }, ", statusURL, ")")
	g.P("}")
	g.P()
	g.P("// StatusHandler returns a handler that answers GET with the status of the")
	g.P("// instance whose saga id is the path value \"id\" (mount it at StatusPattern):")
	g.P("// ids, state, a coarse status (running, completed, failed, cancelled,")
	g.P("// manual_review) and when it last changed; no saga data.")
	g.P("func (", recv, " *", typ, ") StatusHandler() ", httpPkg.Ident("Handler"), " { return ", recv, ".engine.StatusHandler() }")
	g.P()
}

// genCancel renders the typed business cancel request.
func genCancel(g *protogen.GeneratedFile, s *model.Saga, l locals) {
	typ, c := s.GoName(), s.Cancel
	m := c.Message.Proto.GoIdent
	recv, ctx, tx, msg, meta := l.name("s"), l.name("ctx"), l.name("tx"), l.name("msg"), l.name("meta")
	results := " (" + l.name("messageID") + " string, " + l.name("err") + " error)"
	g.P("// CancelTx asks, in the caller's transaction, to cancel the instance ", msg, " names")
	g.P("// by its correlation field (", c.Message.Correlation.Path, "): it writes ", msg, " to the outbox, and the")
	g.P("// saga applies it when its queue delivers it. Before the point of no return")
	g.P("// the saga compensates and ends CANCELLED; after it the cancel is refused.")
	g.P("// The audit trail records who asked (", c.RequestedBy.Path, ") and why (", c.Reason.Path, ").")
	g.P("func (", recv, " *", typ, ") CancelTx(", ctx, " ", contextPkg.Ident("Context"), ", ", tx, " ", pgxPkg.Ident("Tx"), ", ", msg, " *", m,
		", ", meta, " ", messagePkg.Ident("Meta"), ")", results, " {")
	g.P("return ", recv, ".engine.RequestCancelTx(", ctx, ", ", tx, ", ", msg, ", ", meta, ")")
	g.P("}")
	g.P()
	g.P("// Cancel is CancelTx in a transaction of its own.")
	g.P("func (", recv, " *", typ, ") Cancel(", ctx, " ", contextPkg.Ident("Context"), ", ", msg, " *", m,
		", ", meta, " ", messagePkg.Ident("Meta"), ")", results, " {")
	g.P("return ", recv, ".engine.RequestCancel(", ctx, ", ", msg, ", ", meta, ")")
	g.P("}")
	g.P()
}

func infoIdent(m *model.Message) protogen.GoIdent {
	return m.Proto.GoIdent.GoImportPath.Ident(model.InfoVar(m))
}

func msgUnion(lists ...[]*model.Message) []*model.Message {
	var all []*model.Message
	for _, l := range lists {
		all = append(all, l...)
	}
	out := all[:0:0]
	seen := map[*model.Message]bool{}
	for _, m := range all {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}

func genMigrations(g *protogen.GeneratedFile, s *model.Saga, files []string) {
	if len(files) == 0 {
		return
	}
	v := s.MigrationsVar()
	dir := path.Dir(files[0])
	g.P("//go:embed ", strings.Join(files, " "))
	g.P("var ", v, " ", embedPkg.Ident("FS"))
	g.P()
	fn := s.MigrationsFunc()
	g.P("// ", fn, " returns the migrations of table ", s.Table, " as a schema source")
	g.P("// (schema.Migrate applies them in file-name order, each once).")
	g.P("var ", fn, " = ", servicePkg.Ident("Migrations"), "(", v, ", ", strconv.Quote(dir), ", ", strconv.Quote(s.Table), ")")
	g.P()
}

func genBuild(g *protogen.GeneratedFile, s *model.Saga, l locals, errf func(string, ...string) string) {
	data := s.Data.GoIdent
	h, d, ctx, dataVar, command := l.name("h"), l.name("d"), l.name("ctx"), l.name("data"), l.name("command")
	c, ok, err := l.name("c"), l.name("ok"), l.name("err")
	g.P(d, ", ", ok, " := ", dataVar, ".(*", data, ")")
	g.P("if !", ok, " {")
	g.P("return nil, ", errf("saga data is %T, want *"+data.GoName, dataVar))
	g.P("}")
	g.P("switch ", command, " {")
	for _, cmd := range s.Commands {
		g.P("case ", strconv.Quote(cmd.FullName), ":")
		g.P(c, ", ", err, " := ", h, ".d.", buildMethod(cmd), "(", ctx, ", ", d, ")")
		g.P("if ", err, " != nil {")
		g.P("return nil, ", err)
		g.P("}")
		g.P("if ", c, " == nil {")
		g.P("return nil, ", errf(buildMethod(cmd)+" returned no command"))
		g.P("}")
		g.P("return ", c, ", nil")
	}
	g.P("}")
	g.P("return nil, ", errf("no command %s in this saga", command))
	g.P("}")
	g.P()
}
