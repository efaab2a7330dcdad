package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// verdict is what the state machine would do with an operator action on an
// instance as it is now.
type verdict struct {
	allowed bool
	reaches string
	sends   []string // short names
	effect  string   // one sentence, when allowed
	refusal string   // why not, when not allowed
}

// judge asks the saga's state machine what action a would do to the
// instance st, without doing it: sagadef.Definition.Apply on a copy, with
// hooks that build empty messages of the right types instead of calling
// the user's code. The state reached and the messages sent depend on the
// instance, not on the messages' contents, so they are exactly what the
// repair would do now.
func (s *Server) judge(ctx context.Context, t *sagaType, st saga.Status, a action, p Principal) verdict {
	if st.DataError != "" && !saga.AppliesWithoutData(a.trigger) {
		return verdict{refusal: st.DataError + "; " + saga.UnreadableDataHint}
	}
	reason := a.reason
	if reason == "" {
		reason = "preview"
	}
	operator := p.Name
	if operator == "" {
		operator = "preview"
	}
	env := sagadef.Env{Now: s.cfg.Now(), NewID: func() string { return uuid.Must(uuid.NewV7()).String() },
		Hooks: previewHooks{s: s, t: t}}
	res, err := t.def.Apply(ctx, env, instanceOf(st), sagadef.Trigger{Kind: a.trigger, Operator: operator, Reason: reason, ResolveTo: a.to})
	switch {
	case errors.Is(err, sagadef.ErrTerminal):
		return verdict{refusal: fmt.Sprintf("the saga ended in %s: no repair applies", st.State)}
	case errors.Is(err, sagadef.ErrInvalidTrigger):
		return verdict{refusal: fmt.Sprintf("the state machine does not allow %s in state %s", a.name, st.State)}
	case err != nil:
		return verdict{refusal: fmt.Sprintf("the state machine refuses %s in state %s: %v", a.name, st.State, err)}
	case res.Class != sagadef.ClassNew:
		return verdict{refusal: fmt.Sprintf("the state machine refuses %s in state %s (%s)", a.name, st.State, res.Class)}
	}
	v := verdict{allowed: true, reaches: res.To}
	for _, o := range res.Emit {
		v.sends = append(v.sends, short(string(o.Message.ProtoReflect().Descriptor().FullName())))
	}
	v.effect = effect(t.def, st, a, v)
	return v
}

// effect says in one sentence what an allowed repair does.
func effect(def *sagadef.Definition, st saga.Status, a action, v verdict) string {
	move := "the saga goes to " + v.reaches
	if v.reaches == st.State {
		move = "the saga stays in " + v.reaches
	}
	sends := "sends nothing"
	if len(v.sends) > 0 {
		sends = "sends " + strings.Join(v.sends, ", ")
	}
	switch a.name {
	case ActionRetry:
		return fmt.Sprintf("Retry resends what the saga waits on with a fresh attempt budget: it %s and %s.", sends, move)
	case ActionCompensate:
		return fmt.Sprintf("Compensate stops waiting and undoes the completed steps in reverse order: it %s and %s.", sends, move)
	case ActionCancel:
		done := completedCompensatable(def, st)
		undo := "nothing it did needs undoing"
		if len(done) > 0 {
			undo = strings.Join(done, ", ") + " stay done (compensate first to undo them)"
		}
		return fmt.Sprintf("Cancel ends the saga as %s without compensating: %s; it %s.", v.reaches, undo, sends)
	case ActionResolve:
		return fmt.Sprintf("Resolve ends the saga as %s and %s: use it once the work was finished or written off by hand.", v.reaches, sends)
	}
	return fmt.Sprintf("It %s and %s.", sends, move)
}

// completedCompensatable lists the saga's completed steps that have a
// compensation and were not compensated.
func completedCompensatable(def *sagadef.Definition, st saga.Status) []string {
	var out []string
	for _, name := range st.Progress.Completed {
		step, ok := def.LookupStep(name)
		if ok && step.Compensation != "" && !slices.Contains(st.Progress.Compensated, name) {
			out = append(out, name)
		}
	}
	return out
}

// actionViews judges every repair of st (resolve once per target state),
// for the timeline: the console offers only the allowed ones.
func (s *Server) actionViews(ctx context.Context, t *sagaType, st saga.Status, p Principal) []ActionView {
	type cand struct{ name, to string }
	cands := []cand{{ActionRetry, ""}, {ActionCompensate, ""}, {ActionCancel, ""}}
	for _, to := range []string{sagadef.StateCompleted, sagadef.StateFailed, sagadef.StateCancelled} {
		cands = append(cands, cand{ActionResolve, to})
	}
	out := make([]ActionView, 0, len(cands))
	for _, c := range cands {
		a := action{name: c.name, trigger: actionTriggers[c.name], to: c.to}
		v := s.judge(ctx, t, st, a, p)
		out = append(out, ActionView{Action: c.name, To: c.to, Allowed: v.allowed, Reaches: v.reaches, Sends: v.sends,
			Effect: v.effect, Refusal: v.refusal})
	}
	return out
}

// instanceOf is the machine's view of a stored instance.
func instanceOf(st saga.Status) sagadef.Instance {
	return sagadef.Instance{
		ID: st.ID, Type: st.Type, BusinessKey: st.BusinessKey, State: st.State, Version: st.Version, Data: st.Data,
		Attempt: st.Attempt, PendingMessageID: st.PendingMessageID, Progress: st.Progress,
		TimeoutAt: st.TimeoutAt, DeadlineAt: st.DeadlineAt, LastError: st.LastError, ReviewReason: st.ReviewReason,
	}
}

// previewHooks stand in for the user's hooks when the admin server asks the
// state machine what a repair would do: commands are built empty (their
// type is what matters), and nothing is folded into the saga data.
type previewHooks struct {
	s *Server
	t *sagaType
}

func (h previewHooks) Start(context.Context, message.Message) (proto.Message, string, error) {
	return nil, "", errors.New("a preview starts no saga")
}

func (h previewHooks) Build(_ context.Context, command string, _ proto.Message) (message.Message, error) {
	info, ok := h.s.lookupWith(h.t.engine, command)
	if !ok || info.New == nil {
		return nil, fmt.Errorf("message type %s is not registered", command)
	}
	return info.New(), nil
}

func (h previewHooks) Apply(context.Context, proto.Message, message.Message) error { return nil }
