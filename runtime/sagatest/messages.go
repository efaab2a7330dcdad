package sagatest

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Message is a minimal [message.Message] for tests that cannot use generated
// code: a string value travelling under any contract full name. With a type
// from [NewType], its IdempotencyKey is "FULLNAME/VALUE" and its
// CorrelationKey is the value, so commands built from the same saga data
// carry the same key; a [Type] can say otherwise. The runtime's package tests
// (saga, participant, consumer, outbox) share it.
type Message struct {
	*wrapperspb.StringValue
	info *message.Info
	keys *Type
}

// Type describes a test message type whose keys or routing differ from
// [NewType]'s.
type Type struct {
	FullName string
	Kind     message.Kind
	// Exchange and RoutingKey default to NewType's: "sagatest.KIND" and
	// the lower-case full name.
	Exchange, RoutingKey string
	// SchemaVersion defaults to 1.
	SchemaVersion int32
	// IdempotencyKey and CorrelationKey derive the keys from the value;
	// nil: "FULLNAME/VALUE" and the value.
	IdempotencyKey, CorrelationKey func(value string) string
}

// Info returns the description of t. Its New builds a [*Message]; it can be
// registered in a [message.Registry] like generated infos.
func (t Type) Info() *message.Info {
	info := &message.Info{
		FullName:      t.FullName,
		Kind:          t.Kind,
		Exchange:      t.Exchange,
		RoutingKey:    t.RoutingKey,
		SchemaVersion: t.SchemaVersion,
	}
	if info.Exchange == "" {
		info.Exchange = "sagatest." + t.Kind.String()
	}
	if info.RoutingKey == "" {
		info.RoutingKey = strings.ToLower(t.FullName)
	}
	if info.SchemaVersion == 0 {
		info.SchemaVersion = 1
	}
	keys := &t
	info.New = func() message.Message {
		return &Message{StringValue: &wrapperspb.StringValue{}, info: info, keys: keys}
	}
	return info
}

// NewType returns the description of a test message type with the given
// full name and kind. Its New builds a [*Message]; it can be registered in a
// [message.Registry] like generated infos.
func NewType(fullName string, kind message.Kind) *message.Info {
	return Type{FullName: fullName, Kind: kind}.Info()
}

// NewMessage returns a message of the given type carrying value. info is
// one [NewType] or [Type.Info] made, or any other (the message then has
// NewType's keys).
func NewMessage(info *message.Info, value string) *Message {
	if info.New != nil {
		if m, ok := info.New().(*Message); ok {
			m.Value = value
			return m
		}
	}
	return &Message{StringValue: wrapperspb.String(value), info: info}
}

// SagaMessageInfo returns the message's type description.
func (m *Message) SagaMessageInfo() *message.Info { return m.info }

// IdempotencyKey returns "FULLNAME/VALUE", or what its Type derives.
func (m *Message) IdempotencyKey() string {
	if m.keys != nil && m.keys.IdempotencyKey != nil {
		return m.keys.IdempotencyKey(m.GetValue())
	}
	return m.info.FullName + "/" + m.GetValue()
}

// CorrelationKey returns the value, or what its Type derives.
func (m *Message) CorrelationKey() string {
	if m.keys != nil && m.keys.CorrelationKey != nil {
		return m.keys.CorrelationKey(m.GetValue())
	}
	return m.GetValue()
}

// Hooks returns [sagadef.Hooks] for definitions whose messages are test
// [Message]s of the given types. The saga data is a structpb.Struct holding
// the business key (the start message's value) and the full names of every
// message folded into it, in order (see [Applied]). Build returns a message
// of the requested type carrying the business key.
func Hooks(types ...*message.Info) sagadef.Hooks {
	h := keyHooks{types: make(map[string]*message.Info, len(types))}
	for _, t := range types {
		h.types[t.FullName] = t
	}
	return h
}

type keyHooks struct {
	types map[string]*message.Info
}

func (h keyHooks) Start(_ context.Context, start message.Message) (proto.Message, string, error) {
	key := start.CorrelationKey()
	if key == "" {
		return nil, "", fmt.Errorf("start message %s has no value to use as business key", start.SagaMessageInfo().FullName)
	}
	data := &structpb.Struct{Fields: map[string]*structpb.Value{
		"key":     structpb.NewStringValue(key),
		"applied": structpb.NewListValue(&structpb.ListValue{}),
	}}
	return data, key, nil
}

func (h keyHooks) Build(_ context.Context, command string, data proto.Message) (message.Message, error) {
	info, ok := h.types[command]
	if !ok {
		return nil, fmt.Errorf("sagatest hooks: unknown command type %s", command)
	}
	s, ok := data.(*structpb.Struct)
	if !ok {
		return nil, fmt.Errorf("sagatest hooks: saga data is %T, want *structpb.Struct", data)
	}
	return NewMessage(info, s.GetFields()["key"].GetStringValue()), nil
}

func (h keyHooks) Apply(_ context.Context, data proto.Message, msg message.Message) error {
	s, ok := data.(*structpb.Struct)
	if !ok {
		return fmt.Errorf("sagatest hooks: saga data is %T, want *structpb.Struct", data)
	}
	list := s.GetFields()["applied"].GetListValue()
	if list == nil {
		return fmt.Errorf("sagatest hooks: saga data has no applied list")
	}
	list.Values = append(list.Values, structpb.NewStringValue(msg.SagaMessageInfo().FullName))
	return nil
}

// Applied returns the full names of the messages [Hooks] folded into data,
// in order.
func Applied(data proto.Message) []string {
	s, ok := data.(*structpb.Struct)
	if !ok {
		return nil
	}
	var out []string
	for _, v := range s.GetFields()["applied"].GetListValue().GetValues() {
		out = append(out, v.GetStringValue())
	}
	return out
}

// Skip implements [sagadef.Skipper]: [Hooks] run every conditional step.
// Wrap them with [Skipping] to skip some.
func (h keyHooks) Skip(context.Context, string, proto.Message) (bool, string, error) {
	return false, "", nil
}

// Skipping returns hooks that decide conditional steps with skip (called
// with the step's name and the saga data) and leave every other decision
// to h.
func Skipping(h sagadef.Hooks, skip func(step string, data proto.Message) (bool, string)) sagadef.Hooks {
	return skipHooks{Hooks: h, skip: skip}
}

type skipHooks struct {
	sagadef.Hooks
	skip func(step string, data proto.Message) (bool, string)
}

func (h skipHooks) Skip(_ context.Context, step string, data proto.Message) (bool, string, error) {
	skip, reason := h.skip(step, data)
	return skip, reason, nil
}
