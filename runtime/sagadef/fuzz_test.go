package sagadef_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// fuzzKinds are the trigger kinds a fuzz script picks from: every message of
// the fixtures (commands, replies, events), every Trigger* constant, and
// names no definition knows.
var fuzzKinds = append(append(slices.Sorted(maps.Keys(types)), slices.Sorted(maps.Keys(tripTypes))...),
	sagadef.TriggerStart, sagadef.TriggerTimeout, sagadef.TriggerDeadline,
	sagadef.TriggerOperatorRetry, sagadef.TriggerOperatorCompensate, sagadef.TriggerOperatorResolve, sagadef.TriggerOperatorCancel,
	"", "shop.v1.Unknown", "operator.unknown")

// fuzzScript turns fuzz bytes into triggers against the harness's current
// instance: each 4-byte chunk picks a kind, the message carried (matching,
// missing or of another type), the causation id (the pending command, any
// command the saga sent, or garbage), the clock step and the operator's
// resolve target.
func fuzzScript(d *sagadef.Definition, h *sagatest.Harness, script []byte, apply func(sagadef.Trigger)) {
	for i := 0; i+4 <= len(script) && i < 4*64; i += 4 {
		op, msgSel, causeSel, extra := script[i], script[i+1], script[i+2], script[i+3]
		kind := fuzzKinds[int(op)%len(fuzzKinds)]
		trig := sagadef.Trigger{Kind: kind, Operator: "fuzz", Reason: "fuzz"}
		info, ok := types[kind]
		if !ok {
			info, ok = tripTypes[kind]
		}
		if ok {
			switch msgSel % 4 {
			case 0, 1:
				trig.Message = sagatest.NewMessage(info, "order-1")
			case 2:
				kinds := slices.Sorted(maps.Keys(types))
				other := kinds[int(msgSel)%len(kinds)]
				trig.Message = sagatest.NewMessage(types[other], "order-1")
			case 3: // no message
			}
		}
		inst := h.Instance()
		sent := slices.Sorted(maps.Keys(inst.Progress.Sent))
		sent = append(sent, slices.Sorted(maps.Keys(inst.Progress.SentCompensations))...)
		switch c := int(causeSel); {
		case c%4 == 0:
			trig.CausationID = inst.PendingMessageID
		case c%4 == 1 && len(sent) > 0:
			trig.CausationID = sent[c%len(sent)]
		case c%4 == 2:
			trig.CausationID = fmt.Sprintf("garbage-%d", c)
		}
		if kind == sagadef.TriggerOperatorResolve {
			states := []string{"", "NOT_A_STATE"}
			for _, s := range d.States {
				states = append(states, s.Name)
			}
			trig.ResolveTo = states[int(extra)%len(states)]
		}
		h.Advance(time.Duration(extra) * time.Second)
		apply(trig)
	}
}

// FuzzApply drives the Place Order, quote approval and trip booking (a
// parallel group) machines with random trigger scripts. Apply never panics, never modifies the instance or the
// message it is given (the harness compares deep copies), every transition it
// makes is a row of the derived table (the harness checks), and versions
// only move by one.
func FuzzApply(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 10, 3, 1, 1, 20})
	f.Add([]byte{byte(len(types) + len(tripTypes) + 1), 0, 0, 60, byte(len(types) + len(tripTypes) + 1), 0, 0, 60, byte(len(types) + len(tripTypes) + 4), 0, 0, 0})
	f.Add([]byte{byte(len(types) + len(tripTypes) + 5), 0, 0, 3, byte(len(types) + len(tripTypes) + 3), 0, 0, 0, 0, 2, 2, 0})
	defs := []*sagadef.Definition{compiled(f, placeOrder()), compiled(f, quoteApproval()), compiled(f, placeOrder(checked, cancellable)),
		compiled(f, placeOrder(checked, cancellable, conditional("ValidateOrder", "ReserveInventory", "AwaitFraudClearance", "ApproveOrder"))),
		compiled(f, bookTrip(func(d *sagadef.Definition) { d.Cancel = sagadef.Cancel{Message: tCancelTrip} }))}
	starts := []message.Message{msg(pPlaceOrder), msg(qRequestQuote), msg(pPlaceOrder), msg(pPlaceOrder), tripMsg(tBookTrip)}
	hookSets := []sagadef.Hooks{hooks(), hooks(), hooks(), skipping("ReserveInventory", "ApproveOrder"), tripHooks()}
	f.Fuzz(func(t *testing.T, script []byte) {
		for i, d := range defs {
			h := sagatest.New(t, d, hookSets[i])
			h.Start(starts[i])
			fuzzScript(d, h, script, func(trig sagadef.Trigger) {
				var before proto.Message
				if trig.Message != nil {
					before = proto.Clone(trig.Message)
				}
				v := h.Instance().Version
				res, err := h.TryApply(trig)
				if trig.Message != nil {
					require.True(t, proto.Equal(before, trig.Message), "Apply modified the trigger's message")
				}
				if err != nil {
					return
				}
				require.Contains(t, []int64{v, v + 1}, res.Instance.Version, "version moved from %d to %d", v, res.Instance.Version)
				if res.IsTransition() {
					require.Equal(t, v+1, res.Instance.Version, "a transition bumps the version")
				}
			})
		}
	})
}

// FuzzApplyCorruptInstance applies random triggers to instances as a
// damaged or hand-edited row could hold them — unknown or empty states,
// negative attempts, missing data, progress naming unknown steps — straight
// through Definition.Apply. It must answer with a result or an error, never
// panic, and leave its input alone.
func FuzzApplyCorruptInstance(f *testing.F) {
	f.Add("RESERVE_INVENTORY", int64(1), 0, true, "ReserveInventory", "m-1", "shop.v1.InventoryReserved", "m-1")
	f.Add("", int64(0), -1, false, "", "", "", "")
	f.Add("MANUAL_REVIEW", int64(9), 3, true, "Nope", "x", "operator.retry", "")
	f.Add("COMPENSATING_RESERVE_INVENTORY", int64(4), 1, true, "ReserveInventory", "c-1", "timeout", "c-1")
	d := compiled(f, placeOrder())
	env := sagadef.Env{Now: sagatest.Epoch, NewID: func() string { return "id" }, Hooks: hooks()}
	f.Fuzz(func(t *testing.T, state string, version int64, attempt int, withData bool, step, sentID, kind, cause string) {
		inst := sagadef.Instance{
			ID: "saga-1", Type: d.Name, BusinessKey: "order-1", State: state, Version: version, Attempt: attempt,
			PendingMessageID: sentID,
			Progress: sagadef.Progress{
				Completed: []string{step}, Stopped: []string{step}, ReviewFrom: state,
				Sent:              map[string]string{sentID: step},
				SentCompensations: map[string]string{sentID: step},
				Outcomes:          map[string]string{step: kind},
			},
			TimeoutAt: sagatest.Epoch,
		}
		if withData {
			inst.Data = sagatest.NewMessage(types[pPlaceOrder], "order-1")
		}
		trig := sagadef.Trigger{Kind: kind, MessageID: "m-new", CausationID: cause, Operator: "fuzz", Reason: "fuzz", ResolveTo: state}
		if info, ok := types[kind]; ok {
			trig.Message = sagatest.NewMessage(info, "order-1")
		}
		before := deepInstance(inst)
		res, err := d.Apply(context.Background(), env, inst, trig)
		require.Equal(t, before, deepInstance(inst), "Apply modified its input")
		if err == nil {
			require.NotEmpty(t, res.Instance.State)
		}
		_ = d.Classify(inst, trig)
		require.Equal(t, before, deepInstance(inst), "Classify modified its input")
	})
}

// deepInstance renders an instance with its data as comparable values.
func deepInstance(inst sagadef.Instance) any {
	var data []byte
	if inst.Data != nil {
		data, _ = proto.MarshalOptions{Deterministic: true}.Marshal(inst.Data)
	}
	p := inst.Progress
	inst.Data = nil
	return fmt.Sprintf("%+v|%v|%v|%v|%v|%v|%v|%v|%x", inst, p.Completed, p.Compensated, p.Outcomes, p.Sent, p.Stopped,
		p.SentCompensations, p.CompensationOutcomes, data)
}
