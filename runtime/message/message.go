// Package message describes the messages a saga contract declares: their kind
// (command, event, reply), where they are routed, and how their identity is
// derived. Generated code implements [Message] for every annotated proto
// message; the runtime reads only this package's types, never the generator.
//
// # Envelope
//
// [Envelope] is the one envelope every message travels in: the identity and
// tracing metadata that accompany a protobuf body from the outbox row,
// through the broker, to the consumer's inbox.
//
// On the wire the metadata lives in AMQP properties and headers (see the
// Header* constants); the body is protobuf binary. In PostgreSQL it lives in
// the outbox row's columns.
//
// Invariants: [New] always produces a complete envelope (a UUIDv7 message id,
// a correlation id, type and schema version from the generated
// [Info], a deterministic protobuf body), so every published message
// carries the metadata consumers need. [FromDelivery] is the mirror image:
// it refuses a delivery whose message id, type or schema version is missing
// or malformed with an error matching [ErrInvalidMetadata], which consumers
// treat as permanent (park at once, never retry). Header readers
// ([HeaderInt], [HeaderString], [HeaderTime]) accept every encoding other
// clients and the broker use for the same value and never panic.
package message

import (
	"time"

	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"
)

// Kind is the role a message plays in a contract.
type Kind int

// Message kinds. The zero value is invalid: every annotated message has a kind.
const (
	KindUnspecified Kind = iota
	// KindCommand asks exactly one owner to do something.
	KindCommand
	// KindEvent states a fact; any number of subscribers may react.
	KindEvent
	// KindReply answers exactly one command and carries that command's id.
	KindReply
)

// String returns the lower-case name of the kind.
func (k Kind) String() string {
	switch k {
	case KindCommand:
		return "command"
	case KindEvent:
		return "event"
	case KindReply:
		return "reply"
	default:
		return fmt.Sprintf("kind(%d)", int(k))
	}
}

// Info is the static description of one message type, generated from its
// options. It is immutable and shared: never modify a generated Info.
type Info struct {
	// FullName is the proto full name, e.g. "shop.order.v1.ReserveInventory".
	// It is the message type written into every envelope.
	FullName string
	// Kind is the message's role.
	Kind Kind
	// Exchange is the AMQP exchange the message is published to.
	Exchange string
	// RoutingKey is the AMQP routing key (dot-separated topic words).
	RoutingKey string
	// SchemaVersion is the contract's schema version of this message.
	// Consumers park messages whose version they do not understand.
	SchemaVersion int32
	// SensitiveFields lists proto field paths whose values are redacted in
	// logs, parked-message views and the console.
	SensitiveFields []string
	// TimeToBeReceived bounds how long after it is sent (or, when
	// scheduled, after it is due) a message may still be handled: [New]
	// stamps its expiry into the HeaderExpiresAt header and a consumer
	// parks it, unhandled, with the reason "expired" once that time has
	// passed. Zero: it never expires.
	TimeToBeReceived time.Duration
	// New returns a new, empty message of this type.
	New func() Message
}

// Message is implemented by generated code for every annotated proto message.
type Message interface {
	proto.Message
	// SagaMessageInfo returns the message's static description.
	SagaMessageInfo() *Info
	// IdempotencyKey returns the business idempotency key built from the
	// fields the contract names (never a delivery tag). Empty when the
	// contract names none (events and replies may omit it).
	IdempotencyKey() string
	// CorrelationKey returns the value of the contract's correlation field:
	// the saga's business key or saga id. Empty when none is declared.
	CorrelationKey() string
}

// Registry maps message full names to their Info, so a consumer can decode a
// delivery by its type header. The zero value is not usable; call
// [NewRegistry].
type Registry struct {
	byName map[string]*Info
}

// NewRegistry returns a registry holding infos. It returns an error when two
// infos share a full name with different definitions or an info is incomplete.
func NewRegistry(infos ...*Info) (*Registry, error) {
	r := &Registry{byName: make(map[string]*Info, len(infos))}
	if err := r.Add(infos...); err != nil {
		return nil, err
	}
	return r, nil
}

// Add registers infos. Registering the same *Info twice is a no-op.
func (r *Registry) Add(infos ...*Info) error {
	for _, in := range infos {
		if in == nil || in.FullName == "" || in.New == nil {
			return fmt.Errorf("register message: incomplete info %+v", in)
		}
		if prev, ok := r.byName[in.FullName]; ok && prev != in {
			return fmt.Errorf("register message %s: registered twice with different infos", in.FullName)
		}
		r.byName[in.FullName] = in
	}
	return nil
}

// Lookup returns the info registered under fullName.
func (r *Registry) Lookup(fullName string) (*Info, bool) {
	in, ok := r.byName[fullName]
	return in, ok
}

// Decode unmarshals body as the message type fullName.
func (r *Registry) Decode(fullName string, body []byte) (Message, error) {
	in, ok := r.byName[fullName]
	if !ok {
		return nil, fmt.Errorf("decode message: unknown message type %q", fullName)
	}
	m := in.New()
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("decode message %s: %w", fullName, err)
	}
	return m, nil
}

// OnceKey is the key a participant records its effect for command m under
// (participant.Idempotent): the type's full name and the idempotency key
// ("shop.inventory.v1.ReserveInventory/o-42"), and for a command an
// operator retried after its step recorded a failure, the retry's count
// ("…/o-42#operator-retry-1"), so the retry runs again instead of answering
// with the stored failure. The saga engine computes the same key for the
// command a compensation undoes (envelope.HeaderCompensates).
func OnceKey(m Message, operatorRetry int) string {
	key := m.SagaMessageInfo().FullName + "/" + m.IdempotencyKey()
	if operatorRetry > 0 {
		key += "#operator-retry-" + strconv.Itoa(operatorRetry)
	}
	return key
}

// SupportPackageIsVersion8 is referenced by generated code to assert at
// compile time that the runtime it imports is new enough. A runtime that
// breaks generated code drops the old constant and adds the next one, and
// a generator whose code needs something older runtimes lack (an
// identifier, or a transition table sagadef did not compute yet) refers to
// the next one.
//
// Version 8: generated sagas may declare parallel groups
// (sagadef.Definition.Groups, sagadef.Group, sagadef.Step.Group, group
// states of kind sagadef.StateKindGroup, and the transition tables
// sagadef derives for them); a generated scenario's MoveReply may name the
// group member it answers (sagatest.Move.Step). Only the code generated
// for a contract that declares a group refers to this constant.
const SupportPackageIsVersion8 = true

// SupportPackageIsVersion7 is referenced by code generated for version 7,
// which this runtime still compiles (see [SupportPackageIsVersion8]).
//
// Version 7: generated sagas may declare check steps (sagadef.RoleCheck)
// and conditional steps (sagadef.Step.Conditional, decided by the hooks'
// sagadef.Skipper); generated code of a package whose events name
// subscribers returns service.SubscriberFunc (service.UnexpectedEvent) and
// registers them with service.Subscriber; a package whose messages declare
// retry policies sets broker.Plan.Retry (broker.RetryPolicy) and
// service.Package.Retry; every command and event gets Schedule<Msg>
// (service.Schedule), and a type with a time to be received sets
// Info.TimeToBeReceived; generated test packages hold each saga's scenarios
// computed from its graph and a test running them (sagatest.Scenario, Move,
// ScenarioEnv, RunScenarios, StubHooks). Generated sagas may start child
// sagas (sagadef.Step.Child) and declare the replies by which they answer a
// parent (sagadef.Definition.Replies, sagadef.Replies, a manual-review reply
// included, sagadef.Step.ChildReview), whose transition
// table compensates a completed child on its cancel.
const SupportPackageIsVersion7 = true

// SupportPackageIsVersion6 is referenced by code generated for version 6,
// which this runtime still compiles (see [SupportPackageIsVersion8]).
//
// Version 6: generated code imports six runtime packages (broker, message,
// participant, saga, sagadef, service): it declares its topology as a
// broker.Plan (TopologyPlan), publishes through service.Publish, builds its
// migrations with service.Migrations and answers an unexpected command with
// participant.UnexpectedCommand; the generated saga type has no Handler
// method (a host runs the saga).
const SupportPackageIsVersion6 = true

// SupportPackageIsVersion5 is referenced by code generated for version 5,
// which this runtime still compiles (see [SupportPackageIsVersion8]).
//
// Version 5: generated code marks a participant's undecodable command with
// retry.Permanent and takes publishing metadata as message.Meta (the failure
// classes are part of runtime/retry, the envelope part of this package), so
// code generated for version 4, which imports runtime/failure and
// runtime/envelope, does not compile against this runtime: version 4 is
// dropped. Generated sagas also declare sagadef.Definition.Callback (the
// contract's HTTP callbacks).
//
// Version 4: generated transition tables follow the late-reply table of
// docs/options.md (a late success the saga no longer counts on goes to
// review under the manual-review policy, a compensation's earlier answer is
// applied, a failed compensation after the saga ended goes to review) and
// have the rows of an external step's event recorded in manual review
// before the saga reached the step. Code generated for version 3 fails at
// start with sagadef.ErrStaleTable on this runtime, so version 3 is
// dropped.
//
// Version 3: generated packages register on a host (runtime/host: Register
// functions, SagaPackage) and answer late with participant.ReplyLater;
// generated sagas call saga.Get, saga.GetByID, saga.List,
// Engine.StatusHandler and Engine.RequestCancelTx, declare
// sagadef.Definition.Cancel, and their harnesses call sagatest's Cancel.
const SupportPackageIsVersion5 = true
