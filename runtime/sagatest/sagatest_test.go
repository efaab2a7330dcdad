package sagatest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

var (
	tStart  = sagatest.NewType("t.v1.Start", message.KindCommand)
	tDo     = sagatest.NewType("t.v1.Do", message.KindCommand)
	tDone   = sagatest.NewType("t.v1.Done", message.KindReply)
	tFailed = sagatest.NewType("t.v1.Failed", message.KindReply)
)

func definition() *sagadef.Definition {
	return &sagadef.Definition{
		Name: "t.v1.Saga", StartMessage: tStart.FullName, Deadline: time.Hour,
		Steps: []sagadef.Step{{
			Name: "Do", Role: sagadef.RoleRetriable, Command: tDo.FullName,
			SuccessReplies: []string{tDone.FullName}, FailureReplies: []string{tFailed.FullName},
			Timeout: time.Minute, OnTimeout: sagadef.TimeoutRetry, MaxAttempts: 2, Late: sagadef.LateIgnore,
		}},
	}
}

func TestHarness(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, definition(), sagatest.Hooks(tStart, tDo, tDone, tFailed))
	h.Start(sagatest.NewMessage(tStart, "k1"))
	h.RequireState("DO")
	h.RequireSent(tDo.FullName)
	require.Equal(t, "msg-1", h.Instance().PendingMessageID)
	require.Equal(t, "k1", h.Instance().BusinessKey)

	first := h.Instance().PendingMessageID
	h.Timeout()
	require.Equal(t, sagatest.Epoch.Add(time.Minute+time.Millisecond), h.Now())
	h.RequireSent(tDo.FullName)
	require.Equal(t, "t.v1.Do/k1", h.LastSent(tDo.FullName).Message.IdempotencyKey())

	h.ReplyTo(first, sagatest.NewMessage(tDone, "k1"))
	h.RequireClass(sagadef.ClassLate)
	h.Reply(sagatest.NewMessage(tDone, "k1"))
	h.RequireClass(sagadef.ClassNew)
	h.RequireState(sagadef.StateCompleted)
	h.Duplicate()
	h.RequireClass(sagadef.ClassDuplicate)
	last := h.History()[len(h.History())-1]
	require.Equal(t, tDone.FullName, last.Trigger.Kind)
	require.NotEmpty(t, last.Trigger.MessageID)
	require.NotEqual(t, h.History()[len(h.History())-2].Trigger.MessageID, last.Trigger.MessageID, "a duplicate has a new id")
	require.Len(t, h.Sent(), 2)
	require.Equal(t, []string{tDone.FullName}, sagatest.Applied(h.Instance().Data))

	_, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerOperatorRetry, Operator: "o", Reason: "r"})
	require.ErrorIs(t, err, sagadef.ErrTerminal)
}

func TestHarnessOperatorAndDeadline(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, definition(), sagatest.Hooks(tStart, tDo, tDone, tFailed))
	h.Start(sagatest.NewMessage(tStart, "k1"))
	h.Deadline()
	h.RequireState(sagadef.StateManualReview)
	h.Operator(sagadef.TriggerOperatorRetry, "try again")
	h.RequireState("DO")
	h.RequireSent(tDo.FullName)
	h.Reply(sagatest.NewMessage(tFailed, "k1"))
	h.RequireState(sagadef.StateManualReview)
	h.Resolve(sagadef.StateCancelled, "given up")
	h.RequireState(sagadef.StateCancelled)
}

// TestHarnessOperatorActions: the named operator actions apply their
// trigger with the harness's operator and the reason.
func TestHarnessOperatorActions(t *testing.T) {
	t.Parallel()
	hooks := sagatest.Hooks(tStart, tDo, tDone, tFailed, tCancel)
	for _, tc := range []struct {
		act     func(h *sagatest.Harness) sagadef.Result
		trigger string
		state   string
	}{
		{func(h *sagatest.Harness) sagadef.Result { return h.OperatorRetry("again") }, sagadef.TriggerOperatorRetry, "DO"},
		{func(h *sagatest.Harness) sagadef.Result { return h.OperatorCompensate("undo") }, sagadef.TriggerOperatorCompensate, sagadef.StateFailed},
		{func(h *sagatest.Harness) sagadef.Result { return h.OperatorCancel("stop") }, sagadef.TriggerOperatorCancel, sagadef.StateCancelled},
	} {
		t.Run(tc.trigger, func(t *testing.T) {
			t.Parallel()
			d := definition()
			d.Steps[0].Role, d.Steps[0].OnTimeout = sagadef.RolePivot, sagadef.TimeoutCompensate
			h := sagatest.New(t, d, hooks)
			h.OperatorName = "ops-1"
			h.Start(sagatest.NewMessage(tStart, "k1"))
			res := tc.act(h)
			h.RequireState(tc.state)
			last := h.History()[len(h.History())-1].Trigger
			require.Equal(t, tc.trigger, last.Kind)
			require.Equal(t, "ops-1", last.Operator)
			require.NotEmpty(t, last.Reason)
			require.Contains(t, res.Note, "by ops-1")
		})
	}
}

var tCancel = sagatest.NewType("t.v1.Cancel", message.KindEvent)

// TestHarnessCancel delivers the saga's business cancel message, and only
// that message.
func TestHarnessCancel(t *testing.T) {
	t.Parallel()
	d := definition()
	d.Steps[0].Role, d.Steps[0].OnTimeout = sagadef.RolePivot, sagadef.TimeoutCompensate
	d.Cancel = sagadef.Cancel{Message: tCancel.FullName, RequestedBy: "value", Reason: "value"}
	h := sagatest.New(t, d, sagatest.Hooks(tStart, tDo, tDone, tFailed, tCancel))
	h.Start(sagatest.NewMessage(tStart, "k1"))
	res := h.Cancel(sagatest.NewMessage(tCancel, "k1"))
	h.RequireState(sagadef.StateCancelled)
	require.Equal(t, "k1", res.Instance.Progress.Cancel.RequestedBy)
}

func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	reg, err := message.NewRegistry(tDo, tDone)
	require.NoError(t, err)
	m := sagatest.NewMessage(tDo, "order-7")
	body, err := proto.Marshal(m)
	require.NoError(t, err)
	got, err := reg.Decode(tDo.FullName, body)
	require.NoError(t, err)
	require.Equal(t, tDo, got.SagaMessageInfo())
	require.Equal(t, "order-7", got.CorrelationKey())
	require.Equal(t, "t.v1.Do/order-7", got.IdempotencyKey())
	require.Equal(t, "t.v1.do", tDo.RoutingKey)
}

func TestHooksErrors(t *testing.T) {
	t.Parallel()
	hooks := sagatest.Hooks(tDo)
	_, _, err := hooks.Start(t.Context(), sagatest.NewMessage(tStart, ""))
	require.ErrorContains(t, err, "no value")
	data, key, err := hooks.Start(t.Context(), sagatest.NewMessage(tStart, "k"))
	require.NoError(t, err)
	require.Equal(t, "k", key)
	_, err = hooks.Build(t.Context(), tDone.FullName, data)
	require.ErrorContains(t, err, "unknown command type t.v1.Done")
	_, err = hooks.Build(t.Context(), tDo.FullName, sagatest.NewMessage(tDo, "x"))
	require.ErrorContains(t, err, "want *structpb.Struct")
}
