package model

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// Extension and field numbers used to locate findings in source.
const (
	extMessage = 52700
	extSaga    = 52701

	fieldMessageOptions = 7 // DescriptorProto.options

	msgKind           = 1
	msgRoutingKey     = 2
	msgExchange       = 3
	msgIdempotencyKey = 4
	msgCorrelation    = 5
	msgSensitive      = 6
	msgSchemaVersion  = 7
	msgOwner          = 8
	msgAnswers        = 9
	msgSubscribers    = 10
	msgRetry          = 11
	msgTimeToReceive  = 12

	retryTiers       = 1
	retryMaxAttempts = 2

	sagaName        = 1
	sagaStart       = 2
	sagaBusinessKey = 3
	sagaDeadline    = 4
	sagaSteps       = 6
	sagaService     = 7
	sagaCancel      = 8
	sagaCallback    = 9

	cancelMessage     = 1
	cancelRequestedBy = 2
	cancelReason      = 3

	callbackOutcomes    = 1
	callbackURLField    = 2
	callbackClientField = 3

	stepName                = 1
	stepRole                = 2
	stepCommand             = 3
	stepSuccess             = 4
	stepFailure             = 5
	stepCompensation        = 6
	stepCompensationReply   = 7
	stepCompensationFailure = 8
	stepTimeout             = 9
	stepOnTimeout           = 10
	stepMaxAttempts         = 11
	stepLateReply           = 12
	stepExternal            = 13
	stepConditional         = 14
)

var (
	routingKeyRE = regexp.MustCompile(`^[a-z0-9_-]+(\.[a-z0-9_-]+)*$`)
	exchangeRE   = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)
	serviceRE    = regexp.MustCompile(`^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$`)
	camelRE      = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
)

type builder struct {
	gen      *protogen.Plugin
	messages map[string]*Message
	// all proto messages of the request by full name (annotated or not).
	protos map[string]*protogen.Message
	sagas  []*sagaDecl
	model  *Model
	diags  []Diagnostic
}

type sagaDecl struct {
	opts *sagav1.Saga
	msg  *protogen.Message
	file *protogen.File
	base []int32 // source path of the saga option
	saga *Saga
}

func (b *builder) report(f *protogen.File, p []int32, warning bool, rule, hint, format string, args ...any) {
	if !f.Generate {
		return
	}
	b.diags = append(b.diags, Diagnostic{
		Pos: locate(f, p), Rule: rule, Message: fmt.Sprintf(format, args...), Hint: hint, Warning: warning,
	})
}

func (b *builder) errorf(f *protogen.File, p []int32, rule, hint, format string, args ...any) {
	b.report(f, p, false, rule, hint, format, args...)
}

func walkMessages(ms []*protogen.Message, fn func(*protogen.Message)) {
	for _, m := range ms {
		fn(m)
		walkMessages(m.Messages, fn)
	}
}

// collect reads every annotated message and saga declaration.
func (b *builder) collect() {
	b.protos = map[string]*protogen.Message{}
	files := slices.Clone(b.gen.Files)
	slices.SortFunc(files, func(x, y *protogen.File) int { return cmp.Compare(x.Desc.Path(), y.Desc.Path()) })
	for _, f := range files {
		walkMessages(f.Messages, func(m *protogen.Message) {
			b.protos[string(m.Desc.FullName())] = m
			opts, ok := m.Desc.Options().(*descriptorpb.MessageOptions)
			if !ok || opts == nil {
				return
			}
			if proto.HasExtension(opts, sagav1.E_Message) {
				mo, _ := proto.GetExtension(opts, sagav1.E_Message).(*sagav1.Message)
				b.message(f, m, mo)
			}
			if proto.HasExtension(opts, sagav1.E_Saga) {
				so, _ := proto.GetExtension(opts, sagav1.E_Saga).(*sagav1.Saga)
				b.sagas = append(b.sagas, &sagaDecl{
					opts: so, msg: m, file: f,
					base: path(m.Location.Path, fieldMessageOptions, extSaga),
				})
			}
		})
	}
	b.exchangeKinds()
	// Second pass: references between messages (answers).
	for _, f := range files {
		walkMessages(f.Messages, func(m *protogen.Message) {
			msg := b.messages[string(m.Desc.FullName())]
			if msg == nil {
				return
			}
			mo, _ := proto.GetExtension(m.Desc.Options(), sagav1.E_Message).(*sagav1.Message)
			if ref := mo.GetAnswers(); ref != "" {
				p := path(m.Location.Path, fieldMessageOptions, extMessage, msgAnswers)
				if msg.Kind != sagav1.Kind_KIND_REPLY {
					b.errorf(f, p, "option-misuse", "remove answers or make the message a reply",
						"%s is %s; only replies declare the command they answer", msg.FullName, article(kindName(msg.Kind)))
					return
				}
				if cmdMsg := b.ref(f, p, m.Desc.ParentFile().Package(), "", ref, sagav1.Kind_KIND_COMMAND, "answers"); cmdMsg != nil {
					msg.Answers = cmdMsg
				}
			}
		})
	}
}

// exchangeKinds sets each message's ExchangeKind: "topic" on an exchange
// that carries an event of the request, "direct" on one that carries only
// commands and replies. Commands and replies each go to exactly one queue
// bound with their exact routing key, which a direct exchange routes for a
// fraction of a topic exchange's broker CPU; events keep a topic exchange so
// that subscribers can bind with patterns.
func (b *builder) exchangeKinds() {
	topic := map[string]bool{}
	for _, m := range b.messages {
		if m.Kind == sagav1.Kind_KIND_EVENT {
			topic[m.Exchange] = true
		}
	}
	for _, m := range b.messages {
		m.ExchangeKind = "direct"
		if topic[m.Exchange] {
			m.ExchangeKind = "topic"
		}
	}
}

func kindName(k sagav1.Kind) string {
	switch k {
	case sagav1.Kind_KIND_COMMAND:
		return "command"
	case sagav1.Kind_KIND_EVENT:
		return "event"
	case sagav1.Kind_KIND_REPLY:
		return "reply"
	}
	return "message without kind"
}

func (b *builder) message(f *protogen.File, m *protogen.Message, mo *sagav1.Message) {
	full := string(m.Desc.FullName())
	base := path(m.Location.Path, fieldMessageOptions, extMessage)
	pkg := string(f.Desc.Package())
	msg := &Message{
		Proto: m, File: f, FullName: full, Kind: mo.GetKind(),
		Exchange: mo.GetExchange(), RoutingKey: mo.GetRoutingKey(),
		Sensitive: mo.GetSensitiveFields(), SchemaVersion: mo.GetSchemaVersion(),
		Owner: mo.GetOwner(), Generate: f.Generate,
	}
	b.messages[full] = msg
	b.model.Messages[full] = msg
	kind := kindName(msg.Kind)
	switch msg.Kind {
	case sagav1.Kind_KIND_COMMAND, sagav1.Kind_KIND_EVENT, sagav1.Kind_KIND_REPLY:
	default:
		b.errorf(f, path(base, msgKind), "message-kind", "set kind: KIND_COMMAND, KIND_EVENT or KIND_REPLY",
			"%s is annotated with (saga.v1.message) but declares no kind", full)
		kind = "message"
	}
	if msg.SchemaVersion == 0 {
		msg.SchemaVersion = 1
	} else if msg.SchemaVersion < 0 {
		b.errorf(f, path(base, msgSchemaVersion), "schema-version", "use a positive version",
			"%s: schema_version %d is negative", full, msg.SchemaVersion)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(full, pkg), ".")
	if msg.Exchange == "" {
		msg.Exchange = plural(kind)
		if pkg != "" {
			msg.Exchange = pkg + "." + msg.Exchange
		}
		b.checkAMQPName(f, base, full, "exchange", msg.Exchange)
	} else if !exchangeRE.MatchString(msg.Exchange) || len(msg.Exchange) > 255 || strings.HasPrefix(msg.Exchange, "amq.") {
		b.errorf(f, path(base, msgExchange), "routing-key", "exchange names use letters, digits, '-', '_', '.', ':' and do not start with \"amq.\"",
			"%s: invalid exchange %q", full, msg.Exchange)
	}
	if msg.RoutingKey == "" {
		parts := []string{kind}
		if pkg != "" {
			parts = append(parts, strings.ToLower(pkg))
		}
		msg.RoutingKey = strings.Join(append(parts, Kebab(rel)), ".")
		b.checkAMQPName(f, base, full, "routing key", msg.RoutingKey)
	} else if !routingKeyRE.MatchString(msg.RoutingKey) || len(msg.RoutingKey) > 255 {
		b.errorf(f, path(base, msgRoutingKey), "routing-key", "use dot-separated words of [a-z0-9_-], e.g. \"command.inventory.reserve-inventory.v1\"; no wildcards",
			"%s: invalid routing key %q", full, msg.RoutingKey)
	}
	for i, p := range mo.GetIdempotencyKey() {
		if fp := b.fieldPath(f, path(base, msgIdempotencyKey, int32(i)), m, p, true); fp != nil {
			msg.IdempotencyKey = append(msg.IdempotencyKey, fp)
		}
	}
	if c := mo.GetCorrelationField(); c != "" {
		msg.Correlation = b.fieldPath(f, path(base, msgCorrelation), m, c, true)
	}
	for i, p := range msg.Sensitive {
		b.fieldPath(f, path(base, msgSensitive, int32(i)), m, p, false)
	}
	switch msg.Kind {
	case sagav1.Kind_KIND_COMMAND:
		if len(mo.GetIdempotencyKey()) == 0 {
			b.errorf(f, base, "command-idempotency", "add idempotency_key: [\"<business key field>\"]; participants dedupe effects on it",
				"command %s declares no idempotency key", full)
		}
	case sagav1.Kind_KIND_REPLY:
		if mo.GetCorrelationField() == "" {
			b.errorf(f, base, "reply-correlation", "add correlation_field: \"<business key or saga id field>\"",
				"reply %s declares no correlation field", full)
		}
	}
	b.subscribers(f, base, msg, mo.GetSubscribers())
	if ttl := mo.GetTimeToBeReceived(); ttl != "" {
		p := path(base, msgTimeToReceive)
		if msg.Kind == sagav1.Kind_KIND_REPLY {
			b.errorf(f, p, "option-misuse", "remove time_to_be_received; a reply's wait is bounded by its saga step's timeout",
				"%s is a reply; only commands and events declare a time to be received", full)
		} else {
			msg.TimeToBeReceived = b.duration(f, p, full+": ", ttl, "time_to_be_received")
		}
	}
	if mo.GetRetry() != nil {
		msg.Retry = b.retryPolicy(f, path(base, msgRetry), msg, mo.GetRetry())
	}
	if msg.Owner != "" {
		p := path(base, msgOwner)
		if msg.Kind != sagav1.Kind_KIND_COMMAND {
			b.errorf(f, p, "option-misuse", "remove owner; events have subscribers and replies go back to the saga",
				"%s is %s; only commands have an owner", full, article(kind))
		} else if !serviceRE.MatchString(msg.Owner) {
			b.errorf(f, p, "routing-key", "service names are lower-case words separated by '-', '_' or '.'",
				"%s: invalid owner service name %q", full, msg.Owner)
		}
	}
}

var scalarKinds = map[protoreflect.Kind]bool{
	protoreflect.StringKind: true, protoreflect.BoolKind: true, protoreflect.EnumKind: true,
	protoreflect.Int32Kind: true, protoreflect.Sint32Kind: true, protoreflect.Sfixed32Kind: true,
	protoreflect.Int64Kind: true, protoreflect.Sint64Kind: true, protoreflect.Sfixed64Kind: true,
	protoreflect.Uint32Kind: true, protoreflect.Fixed32Kind: true,
	protoreflect.Uint64Kind: true, protoreflect.Fixed64Kind: true,
}

// fieldPath resolves a dot-separated path of field names in m. Intermediate
// fields must be singular messages; with scalar, the leaf must be a singular
// string, integer, bool or enum field.
func (b *builder) fieldPath(f *protogen.File, p []int32, m *protogen.Message, s string, scalar bool) *FieldPath {
	fp := &FieldPath{Path: s}
	cur := m
	parts := strings.Split(s, ".")
	for i, name := range parts {
		var fld *protogen.Field
		if cur != nil {
			for _, c := range cur.Fields {
				if string(c.Desc.Name()) == name {
					fld = c
					break
				}
			}
		}
		if fld == nil {
			b.errorf(f, p, "field-path", "name a field of the message by its proto name, nested fields joined with '.'",
				"%s: unknown field path %q: %s has no field %q", m.Desc.FullName(), s, messageName(cur), name)
			return nil
		}
		fp.Fields = append(fp.Fields, fld)
		last := i == len(parts)-1
		if !last {
			// GroupKind: a proto2 group or an editions DELIMITED field, a
			// message field encoded differently.
			if k := fld.Desc.Kind(); (k != protoreflect.MessageKind && k != protoreflect.GroupKind) || fld.Desc.IsList() || fld.Desc.IsMap() {
				b.errorf(f, p, "field-path", "only singular message fields can be traversed",
					"%s: field path %q: %s is not a singular message field", m.Desc.FullName(), s, name)
				return nil
			}
			cur = fld.Message
			continue
		}
		if scalar && (fld.Desc.IsList() || fld.Desc.IsMap() || !scalarKinds[fld.Desc.Kind()]) {
			b.errorf(f, p, "field-path", "key fields must be singular strings, integers, bools or enums",
				"%s: field path %q names a %s field, not a scalar", m.Desc.FullName(), s, fieldKind(fld))
			return nil
		}
	}
	return fp
}

func messageName(m *protogen.Message) string {
	if m == nil {
		return "<none>"
	}
	return string(m.Desc.FullName())
}

func fieldKind(f *protogen.Field) string {
	switch {
	case f.Desc.IsMap():
		return "map"
	case f.Desc.IsList():
		return "repeated"
	}
	return f.Desc.Kind().String()
}

// ref resolves a message reference: a name relative to pkg, or a full name
// (optionally with a leading dot). want restricts the kind
// (KIND_UNSPECIFIED: any annotated message). ctx prefixes the finding's
// message ("saga X: step Y: "): a finding inside a step is located at the
// step, so its message says which step and field.
func (b *builder) ref(f *protogen.File, p []int32, pkg protoreflect.FullName, ctx, name string, want sagav1.Kind, what string) *Message {
	return b.refAs("saga-reference", f, p, pkg, ctx, name, want, what)
}

// refAs is ref reporting its findings under rule.
func (b *builder) refAs(rule string, f *protogen.File, p []int32, pkg protoreflect.FullName, ctx, name string, want sagav1.Kind, what string) *Message {
	name = strings.TrimSpace(name)
	var candidates []string
	if strings.HasPrefix(name, ".") {
		candidates = []string{strings.TrimPrefix(name, ".")}
	} else {
		// Protobuf scoping: innermost package first.
		scope := string(pkg)
		for {
			if scope == "" {
				candidates = append(candidates, name)
				break
			}
			candidates = append(candidates, scope+"."+name)
			i := strings.LastIndexByte(scope, '.')
			if i < 0 {
				scope = ""
			} else {
				scope = scope[:i]
			}
		}
	}
	for _, c := range candidates {
		if msg := b.messages[c]; msg != nil {
			if want != sagav1.Kind_KIND_UNSPECIFIED && msg.Kind != want {
				b.errorf(f, p, rule, fmt.Sprintf("%s must name %s", what, article(kindName(want))),
					"%s%s %q is %s, want %s", ctx, what, name, article(kindName(msg.Kind)), article(kindName(want)))
				return nil
			}
			return msg
		}
		if _, ok := b.protos[c]; ok {
			b.errorf(f, p, rule, "annotate it with option (saga.v1.message) = {kind: ...}",
				"%s%s %q names %s, which is not annotated with (saga.v1.message)", ctx, what, name, c)
			return nil
		}
	}
	known := make([]string, 0, len(b.messages))
	for n := range b.messages {
		known = append(known, n)
	}
	slices.Sort(known)
	b.errorf(f, p, rule, didYouMean(name, nameChoices(name, string(pkg), known), "use a message name of this package or a full name, e.g. \"shop.inventory.v1.ReserveInventory\"; a message of another file must be in the same generation request (buf: strategy: all; protoc: one call for all files)"),
		"%s%s %q: unknown message", ctx, what, name)
	return nil
}

// duration parses a timeout or deadline; ctx prefixes the finding's
// message (see ref).
func (b *builder) duration(f *protogen.File, p []int32, ctx, s, what string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.errorf(f, p, "duration", "write a positive Go duration such as \"30s\", \"5m\" or \"72h\"",
			"%sinvalid %s %q", ctx, what, s)
		return 0
	}
	return d
}

// plural returns the exchange suffix of a kind: commands, events, replies.
func plural(kind string) string {
	if kind == "reply" {
		return "replies"
	}
	return kind + "s"
}

// article prefixes a kind name with "a" or "an".
func article(kind string) string {
	if strings.HasPrefix(kind, "e") {
		return "an " + kind
	}
	return "a " + kind
}

// subscribers reads an event's subscribing services: valid service names,
// each listed once, on events only.
func (b *builder) subscribers(f *protogen.File, base []int32, msg *Message, names []string) {
	if len(names) == 0 {
		return
	}
	if msg.Kind != sagav1.Kind_KIND_EVENT {
		b.errorf(f, path(base, msgSubscribers), "option-misuse", "remove subscribers; a command has one owner and a reply goes back to the saga that waits for it",
			"%s is %s; only events have subscribers", msg.FullName, article(kindName(msg.Kind)))
		return
	}
	seen := map[string]bool{}
	for i, name := range names {
		p := path(base, msgSubscribers, int32(i))
		switch {
		case !serviceRE.MatchString(name):
			b.errorf(f, p, "subscriber-service", "service names are lower-case words separated by '-', '_' or '.', e.g. \"notifications\"",
				"%s: invalid subscriber service name %q", msg.FullName, name)
		case seen[name]:
			b.errorf(f, p, "subscriber-service", "list each subscribing service once",
				"%s: subscriber %s is listed twice; a service handles an event once", msg.FullName, name)
		default:
			seen[name] = true
			msg.Subscribers = append(msg.Subscribers, name)
		}
	}
}
