package saga

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Child sagas. A parent saga's child step sends this saga's start message
// (and, to compensate, its cancel message) with the parent's identity in
// the envelope: saga id and type, correlation id, its own message id. The
// engine starts the instance as from any start message (idempotently on the
// business key) and records the parent in Progress.Parent. When a
// transition ends the instance COMPLETED, FAILED or CANCELLED, the same
// transaction writes the outcome's reply (Definition.Replies) into the
// outbox, addressed to the parent as the answer to its start command (to
// its cancel, for cancelled): the parent's engine classifies it like any
// participant's reply, so duplicates, late replies and timeouts need
// nothing of their own. Entering manual review, the instance sends the
// parent its manual-review reply (when it declares one) with its id and
// reason in HeaderChildReview; the parent records it and keeps waiting.

// fromParent returns the parent a delivered message comes from: the saga
// that sent this saga's start or cancel message from a child step (its
// envelope names another saga type). Nil for any other message.
func (e *Engine) fromParent(env *message.Envelope, kind string) *sagadef.Parent {
	if !e.def.Replies.Declared() || env.SagaType == "" || env.SagaType == e.def.Name || env.SagaID == "" {
		return nil
	}
	if kind != e.def.StartMessage && (kind != e.def.Cancel.Message || e.def.Cancel.Message == "") {
		return nil
	}
	return &sagadef.Parent{
		SagaType: env.SagaType, SagaID: env.SagaID, CorrelationID: env.CorrelationID,
		StartMessageID: env.MessageID, Traceparent: env.Traceparent, Tracestate: env.Tracestate,
	}
}

// markParentCancel records, on the instance a parent's cancel just
// compensates, the cancel's message id: the cancelled reply answers it.
func markParentCancel(after *sagadef.Instance, trig sagadef.Trigger, o origin) {
	p := after.Progress.Parent
	if !o.Parent || p == nil || after.Progress.Cancel == nil || after.Progress.Cancel.MessageID != trig.MessageID {
		return
	}
	cp := *p
	cp.CancelMessageID = trig.MessageID
	after.Progress.Parent = &cp
}

// replyToParent writes the outcome reply of a transition from `from` to
// `to` into the outbox, in the transition's transaction, when the instance
// has a parent: completed or failed answer the start command; cancelled
// answers the parent's cancel that stopped the instance (a cancel by
// anyone else, or an operator's, ends the instance without what the parent
// asked for, which it hears as failed). A parent's cancel that finds the
// instance already FAILED or CANCELLED is answered with the cancelled reply
// again: nothing of the child stands.
func (e *Engine) replyToParent(ctx context.Context, tx pgx.Tx, sagaID string, after sagadef.Instance, from, to string, trig sagadef.Trigger, o origin) error {
	p := after.Progress.Parent
	r := e.def.Replies
	if p == nil || !r.Declared() {
		return nil
	}
	reply, causation := "", p.StartMessageID
	switch {
	case from != to && to == sagadef.StateCancelled && p.CancelMessageID != "":
		reply, causation = r.Cancelled, p.CancelMessageID
	case from != to && to == sagadef.StateCancelled:
		reply = r.Failed
	case from != to && to == sagadef.StateManualReview:
		reply = r.ManualReview
	case from != to:
		reply = r.For(to)
	case o.Parent && trig.Kind == e.def.Cancel.Message && (to == sagadef.StateFailed || to == sagadef.StateCancelled):
		reply, causation = r.Cancelled, trig.MessageID
	}
	if reply == "" {
		return nil
	}
	m, err := e.outcomeReply(reply, after.Data)
	if err != nil {
		return fmt.Errorf("saga %s %s: reply %s to parent %s %s: %w", e.def.Name, sagaID, reply, p.SagaType, p.SagaID, err)
	}
	env, err := message.New(m, message.Meta{
		MessageID:     e.cfg.NewID(),
		CorrelationID: p.CorrelationID,
		CausationID:   causation,
		SagaID:        p.SagaID,
		SagaType:      p.SagaType,
		Traceparent:   p.Traceparent,
		Tracestate:    p.Tracestate,
		OccurredAt:    e.cfg.Now(),
	})
	if err != nil {
		return fmt.Errorf("saga %s %s: envelope of reply %s to parent %s %s: %w", e.def.Name, sagaID, reply, p.SagaType, p.SagaID, err)
	}
	if to == sagadef.StateManualReview && from != to {
		env.Headers = map[string]any{message.HeaderChildReview: fmt.Sprintf("%s %s (business key %s): %s",
			e.def.Name, sagaID, businessKey(after), after.ReviewReason)}
	}
	if err := outbox.Enqueue(ctx, tx, env); err != nil {
		return fmt.Errorf("saga %s %s: enqueue reply %s to parent %s %s: %w", e.def.Name, sagaID, reply, p.SagaType, p.SagaID, err)
	}
	return nil
}

// businessKey returns the instance's business key, or "?" when unknown.
func businessKey(in sagadef.Instance) string {
	if in.BusinessKey == "" {
		return "?"
	}
	return in.BusinessKey
}

// childReviewReason returns, for a child's manual-review reply delivered
// to its parent, the child's account of why (HeaderChildReview); "" for
// any other message.
func (e *Engine) childReviewReason(env *message.Envelope, kind string) string {
	ref, ok := e.def.Lookup(kind)
	if !ok || ref.Use != sagadef.UseChildReview {
		return ""
	}
	reason, _, _ := message.HeaderString(env.Headers, message.HeaderChildReview)
	return reason
}

// outcomeReply builds the reply of the given full name (from the engine's
// registry, else the linked protobuf types) from the saga data: each field
// of the reply that the data has with the same name and type is copied.
func (e *Engine) outcomeReply(name string, data proto.Message) (message.Message, error) {
	var m message.Message
	var info *message.Info
	if e.cfg.Registry != nil {
		info, _ = e.cfg.Registry.Lookup(name)
	}
	if info != nil && info.New != nil {
		m = info.New()
	} else {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			return nil, fmt.Errorf("find message type: %w", err)
		}
		var isMsg bool
		if m, isMsg = mt.New().Interface().(message.Message); !isMsg {
			return nil, fmt.Errorf("%s is not a generated saga message", name)
		}
	}
	if data == nil {
		return m, nil
	}
	src, dst := data.ProtoReflect(), m.ProtoReflect()
	fields := dst.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		sd := src.Descriptor().Fields().ByName(fd.Name())
		if sd == nil || !sameType(fd, sd) || !src.Has(sd) {
			continue
		}
		v := src.Get(sd)
		if fd.Message() != nil || fd.IsList() || fd.IsMap() {
			// Composite values are shared by Get: copy them.
			tmp := dst.NewField(fd)
			switch {
			case fd.IsList():
				l := v.List()
				for j := range l.Len() {
					tmp.List().Append(l.Get(j))
				}
			case fd.IsMap():
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					tmp.Map().Set(k, mv)
					return true
				})
			default:
				proto.Merge(tmp.Message().Interface(), v.Message().Interface())
			}
			v = tmp
		}
		dst.Set(fd, v)
	}
	return m, nil
}

// sameType reports whether a and b hold the same kind of value.
func sameType(a, b protoreflect.FieldDescriptor) bool {
	if a.Kind() != b.Kind() || a.Cardinality() != b.Cardinality() || a.IsMap() != b.IsMap() {
		return false
	}
	switch {
	case a.Message() != nil:
		return b.Message() != nil && a.Message().FullName() == b.Message().FullName()
	case a.Enum() != nil:
		return b.Enum() != nil && a.Enum().FullName() == b.Enum().FullName()
	}
	return true
}

// answerRepeatedStart answers a parent's start that finds the instance
// already ended (the parent resent its start command: a retry on timeout,
// an operator's retry) with the outcome reply again, addressed to the
// resent command. A start that finds the instance still running is
// answered when it ends, to the first start.
func (e *Engine) answerRepeatedStart(ctx context.Context, tx pgx.Tx, w row, parent *sagadef.Parent) error {
	if parent == nil || !sagadef.IsTerminal(w.State) {
		return nil
	}
	inst, err := e.instanceFor(w, e.def.StartMessage)
	if err != nil {
		return err
	}
	if inst.Progress.Parent == nil || inst.Progress.Parent.SagaID != parent.SagaID {
		return nil
	}
	again := inst
	p := *parent
	p.CancelMessageID = inst.Progress.Parent.CancelMessageID
	again.Progress.Parent = &p
	if w.State == sagadef.StateCancelled && p.CancelMessageID != "" {
		// The parent cancelled it: its resent start is answered as failed
		// would mislead; the cancel was answered already.
		return nil
	}
	return e.replyToParent(ctx, tx, w.ID, again, "", w.State, sagadef.Trigger{}, origin{})
}
