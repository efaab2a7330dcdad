// Package model turns a protoc plugin request into one validated, sorted
// model of every annotated message and saga, running the design review on
// the way.
//
// Invariants:
//   - Every name and reference is resolved here; renderers read only the
//     model and never look at options.
//   - Collections are sorted (files by path, messages and sagas by full
//     name), so rendering the model is deterministic.
//   - Every finding is collected, none stops the review; [Build] returns all
//     of them at once (errors.Join), sorted by position. Nothing is
//     rendered from a model that has errors.
//   - Findings are reported only for files being generated; dependencies
//     are read for reference but reviewed when they are generated.
package model

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/compiler/protogen"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Model is the whole request, resolved and reviewed.
type Model struct {
	// Files are the generated files that declare annotated messages or
	// sagas, sorted by path.
	Files []*File
	// Messages holds every annotated message of the request (generated files
	// and dependencies), by full name.
	Messages map[string]*Message
	// Packages are the Go packages that receive generated code, sorted by
	// import path.
	Packages []*Package
	// Warnings are findings that did not fail generation.
	Warnings []Diagnostic
}

// Package is one Go package receiving generated code.
type Package struct {
	ImportPath protogen.GoImportPath
	// Files are this package's generated files, sorted by path. The first one
	// carries the package-level code (participants, topology, migrations).
	Files []*File
	// Participants are the command-owning services whose commands are
	// declared in this package, sorted by owner.
	Participants []*Participant
	// Subscribers are the services subscribing to events declared in this
	// package, sorted by service.
	Subscribers []*Subscriber
}

// File is one generated .proto file with annotated content.
type File struct {
	Proto    *protogen.File
	Package  *Package
	Messages []*Message
	Sagas    []*Saga
}

// Message is one annotated command, event or reply.
type Message struct {
	Proto    *protogen.Message
	File     *protogen.File
	FullName string
	Kind     sagav1.Kind
	// Exchange and RoutingKey are resolved (defaults applied).
	Exchange   string
	RoutingKey string
	// ExchangeKind is the AMQP type of Exchange: "topic" when any event of
	// the request is published to it, "direct" otherwise.
	ExchangeKind string
	// IdempotencyKey and Correlation are resolved field paths (scalars).
	IdempotencyKey []*FieldPath
	Correlation    *FieldPath
	// Sensitive lists field paths as written.
	Sensitive     []string
	SchemaVersion int32
	// Owner is the service consuming a command.
	Owner string
	// Subscribers are the services subscribing to an event, as listed
	// (valid names, each once).
	Subscribers []string
	// TimeToBeReceived is how long after it is sent the message may still
	// be handled; zero when it never expires.
	TimeToBeReceived time.Duration
	// Retry is the retry policy the message declares for the queues that
	// consume it; nil when it declares none (or an invalid one).
	Retry *retry.Policy
	// Answers is the command a reply declares it answers (may be nil).
	Answers *Message
	// Results lists, for a command, the replies that answer it (success and
	// failure), sorted by full name. Filled from sagas and Answers.
	Results []*Message
	// ResultOf lists, for a reply, the commands it answers, sorted.
	ResultOf []*Message
	// Generate is true when the message's file is being generated.
	Generate bool
}

// FieldPath is a resolved dot-separated path of proto field names.
type FieldPath struct {
	Path   string
	Fields []*protogen.Field
}

// Leaf returns the last field of the path.
func (p *FieldPath) Leaf() *protogen.Field { return p.Fields[len(p.Fields)-1] }

// Participant is a service owning commands, within one Go package.
type Participant struct {
	Owner string
	// GoName is the service's CamelCase name ("inventory" → "Inventory").
	GoName string
	// Queue is the service's command queue.
	Queue    string
	Commands []*Message
	// Retry is the queue's declared retry policy (its commands'); nil
	// when they declare none.
	Retry *retry.Policy
}

// Subscriber is a service subscribing to events of one Go package.
type Subscriber struct {
	Service string
	// GoName is the service's CamelCase name ("notifications" →
	// "Notifications").
	GoName string
	// Queue is the service's queue for this package's events
	// ([SubscriberQueue]).
	Queue string
	// Events are the events it subscribes to, sorted by full name.
	Events []*Message
	// Retry is the queue's declared retry policy (its events'); nil when
	// they declare none.
	Retry *retry.Policy
}

// Saga is one declared saga.
type Saga struct {
	// Name is the CamelCase saga name; FullName is "<package>.<Name>".
	Name     string
	FullName string
	// Snake is the snake_case name used for table, queue and file names.
	Snake string
	Table string
	Queue string
	// Service is the orchestrating service.
	Service     string
	Data        *protogen.Message
	File        *protogen.File
	Start       *Message
	BusinessKey *FieldPath
	Deadline    time.Duration
	Steps       []*Step
	// Groups lists the saga's parallel groups in declaration order.
	Groups []*Group
	// Definition is the compiled runtime definition (states and the
	// transition table included).
	Definition *sagadef.Definition
	// Handles lists every reply and event the saga folds (its steps'
	// replies and events, and its cancel message), sorted by full name.
	Handles []*Message
	// Consumes lists every message bound to the saga's queue, sorted by
	// full name: Handles (the cancel message included) and the start
	// message (a start command has no owner: rule saga-start). The engine
	// starts an instance from a start message delivered on its queue.
	Consumes []*Message
	// Commands lists every command the saga sends (steps and
	// compensations), sorted by full name.
	Commands []*Message
	// Cancel is the saga's business cancellation; nil when it declares
	// none.
	Cancel *Cancel
	// Callback declares the saga's HTTP callbacks; nil when it declares
	// none.
	Callback *Callback
	// Replies are the replies the saga sends to a parent saga that started
	// it from a child step; nil when it declares none (it cannot be a
	// child).
	Replies  *Replies
	Generate bool
}

// Callback is a saga's HTTP callback declaration: the outcomes (state
// names) delivered and the saga data field naming the target.
type Callback struct {
	States      []string
	URLField    *FieldPath
	ClientField *FieldPath
	IncludeData bool
}

// Cancel is a saga's business cancellation: the message that asks to stop
// an instance and its string fields saying who asked and why.
type Cancel struct {
	Message     *Message
	RequestedBy *FieldPath
	Reason      *FieldPath
}

// Step is one saga step.
type Step struct {
	Name                string
	Role                sagav1.Role
	Command             *Message
	External            bool
	Conditional         bool
	Success             []*Message
	Failure             []*Message
	Compensation        *Message
	CompensationReply   *Message
	CompensationFailure []*Message
	Timeout             time.Duration
	OnTimeout           sagav1.TimeoutAction
	MaxAttempts         int
	Late                sagav1.LateReply
	// Child is the saga the step starts (a child step); nil otherwise.
	Child *Saga
	// Group is the parallel group the step belongs to; nil when it runs
	// alone.
	Group *Group
}

// Group is a saga's parallel group: consecutive steps dispatched together
// and joined when all complete.
type Group struct {
	Name string
	// Timeout bounds the wait for every member's reply.
	Timeout time.Duration
	// Steps are the members in contract order.
	Steps []*Step
	// index is the group's position in the saga option's groups.
	index int
	// bad is set when the review found a problem with the group.
	bad bool
}

// Options configure [Build].
type Options struct {
	// WarningsAsErrors promotes warnings to errors.
	WarningsAsErrors bool
	// KeepModel makes [Build] return the model together with the review's
	// errors, for tools that read a contract the review refuses (buf
	// breaking reads a deployed contract that may fail rules added since).
	// Such a model is never rendered: references that did not resolve are
	// nil and the sagas' definitions are not compiled.
	KeepModel bool
}

// Build resolves and reviews the request. It returns every error finding
// joined (each a [Diagnostic]); the model is nil then, unless
// [Options.KeepModel].
func Build(gen *protogen.Plugin, opts Options) (*Model, error) {
	b := &builder{
		gen:      gen,
		messages: map[string]*Message{},
		model:    &Model{Messages: map[string]*Message{}},
	}
	b.collect()
	b.resolveSagas()
	b.crossChecks()
	b.collisions()
	var errs []Diagnostic
	for _, d := range b.diags {
		if d.Warning && !opts.WarningsAsErrors {
			b.model.Warnings = append(b.model.Warnings, d)
			continue
		}
		d.Warning = false
		errs = append(errs, d)
	}
	sortDiagnostics(errs)
	sortDiagnostics(b.model.Warnings)
	if len(errs) > 0 {
		joined := make([]error, len(errs))
		for i, d := range errs {
			joined[i] = d
		}
		if !opts.KeepModel {
			return nil, errors.Join(joined...)
		}
		b.finish()
		return b.model, errors.Join(joined...)
	}
	b.finish()
	return b.model, nil
}

func byFullName(a, b *Message) int { return cmp.Compare(a.FullName, b.FullName) }

func sortMessages(ms []*Message) []*Message {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, byFullName)
	return slices.CompactFunc(ms, func(a, b *Message) bool { return a == b })
}
