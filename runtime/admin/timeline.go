package admin

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

func (s *Server) handleTimeline(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "type")
	if err != nil {
		return err
	}
	id, err := parseSagaID(r.PathValue("id"))
	if err != nil {
		return err
	}
	t, st, err := s.find(r.Context(), id, q.str("type"))
	if err != nil {
		return err
	}
	tl, err := s.timeline(r.Context(), t, st, principalOf(r.Context()))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, tl)
	return nil
}

// timeline assembles one saga's story from its audit trail, its outbox rows
// and its parked messages.
func (s *Server) timeline(ctx context.Context, t *sagaType, st saga.Status, p Principal) (Timeline, error) {
	now := s.cfg.Now()
	hist, histCut, err := t.engine.RecentHistory(ctx, st.ID, maxTimelineRows)
	if err != nil {
		return Timeline{}, err
	}
	out, err := outbox.SagaMessages(ctx, s.cfg.Pool, st.ID, maxTimelineRows+1)
	if err != nil {
		return Timeline{}, err
	}
	// Its parked messages, those parked without a saga id and joined to it
	// by their correlation field (its id or business key) included.
	parked, err := s.parkedRows(ctx, parked.BySaga, st.ID, maxTimelineRows+1, []string{st.ID, st.BusinessKey})
	if err != nil {
		return Timeline{}, fmt.Errorf("parked messages of saga %s: %w", st.ID, err)
	}
	if err := s.join(ctx, parked); err != nil {
		return Timeline{}, err
	}
	parked = slices.DeleteFunc(parked, func(p parkedRow) bool { return p.SagaID != st.ID }) // a correlation of another saga type
	if err := s.stand(ctx, parked); err != nil {
		return Timeline{}, err
	}
	out, outCut := newest(out)
	parked, parkedCut := newest(parked)

	tl := Timeline{
		Truncated: histCut || outCut || parkedCut,
		Saga:      t.view(rowOf(st), now),
		Data:      s.data(t, st.Data, st.DataError),
		Steps:     stepViews(t.def),
		Mermaid:   t.def.Mermaid(),
		Progress: ProgressView{Completed: st.Progress.Completed, Compensated: st.Progress.Compensated, Stopped: st.Progress.Stopped,
			Parent: st.Progress.Parent, ChildReview: st.Progress.ChildReview, Cancel: st.Progress.Cancel},
		Actions: s.actionViews(ctx, t, st, p),
	}
	// When the saga applied each message it got (its first transition
	// naming it), and which of them have an outbox row in this database.
	applied := map[string]saga.AuditRecord{}
	for _, a := range hist {
		if _, seen := applied[a.MessageID]; a.MessageID != "" && !seen {
			applied[a.MessageID] = a
		}
	}
	inOutbox := map[string]bool{}
	for _, o := range out {
		inOutbox[o.MessageID] = true
	}
	// With the outbox rows cut to the newest, an older message's row may
	// be among those cut: only transitions after the oldest row listed
	// can tell.
	var outFrom time.Time
	if outCut && len(out) > 0 {
		outFrom = out[0].OccurredAt
	}
	visited := map[string]bool{}
	for _, a := range hist {
		visited[a.From], visited[a.To] = true, true
		// A message the saga applied whose outbox row is not in this
		// database (a service with a database of its own, or a publisher
		// without an outbox): listed from the transition that applied it,
		// just before it.
		if a.MessageID != "" && !inOutbox[a.MessageID] && applied[a.MessageID].ID == a.ID && a.At.After(outFrom) &&
			direction(t.def, a.Trigger) == "in" {
			tl.Events = append(tl.Events, Event{At: a.At.UTC(), Kind: EventMessage, Direction: "in", MessageID: a.MessageID,
				MessageType: a.Trigger, CausationID: a.CausationID, ReceivedAt: utcPtr(&a.At), Outside: true,
				Summary: fmt.Sprintf("received %s (sent from outside this database)", short(a.Trigger))})
			tl.Counts.MessagesIn++
		}
		e := Event{
			At: a.At.UTC(), Kind: EventTransition, AuditID: a.ID, From: a.From, To: a.To, Trigger: a.Trigger,
			Class: a.Class, MessageID: a.MessageID, CausationID: a.CausationID, Operator: a.Operator,
			Note: a.Note, Version: a.Version,
		}
		e.Summary = transitionSummary(a)
		tl.Events = append(tl.Events, e)
		tl.Counts.Transitions++
	}
	delete(visited, "")
	// A step settled in the transition that entered it (an External step
	// whose event was recorded early) was never a transition's end: its
	// completion marks it.
	for _, step := range st.Progress.Completed {
		visited[sagadef.StateName(step)] = true
	}
	tl.States = stateViews(t.def, st.State, visited)
	tl.Position = position(t.def, st, hist)

	sentPerStep := map[string]int{}
	for _, o := range out {
		dir := direction(t.def, o.MessageType)
		e := Event{
			At: o.OccurredAt.UTC(), Kind: EventMessage, Direction: dir, MessageID: o.MessageID, MessageType: o.MessageType,
			CausationID: o.CausationID, Exchange: o.Exchange, RoutingKey: o.RoutingKey,
			PublishedAt: utcPtr(o.PublishedAt), PublishAttempts: o.Attempts, Body: s.body(o.MessageType, o.Body),
		}
		verb := "sent"
		if dir == "in" {
			verb = "received reply"
		}
		var notes []string
		switch dir {
		case "out":
			tl.Counts.MessagesOut++
			if ref, ok := t.def.Lookup(o.MessageType); ok {
				key := ref.Use.String() + "/" + ref.Step
				sentPerStep[key]++
				if n := sentPerStep[key]; n > 1 {
					notes = append(notes, fmt.Sprintf("attempt %d", n))
					tl.Counts.Retries++
				}
			}
		case "in":
			tl.Counts.MessagesIn++
			if a, ok := applied[o.MessageID]; ok {
				e.ReceivedAt = utcPtr(&a.At)
			}
		}
		if o.PublishedAt == nil {
			notes = append(notes, "not yet published")
		}
		e.Summary = fmt.Sprintf("%s %s", verb, short(o.MessageType))
		if len(notes) > 0 {
			e.Summary += " (" + strings.Join(notes, ", ") + ")"
		}
		tl.Events = append(tl.Events, e)
	}
	for _, p := range parked {
		e := Event{
			At: p.ParkedAt, Kind: EventParked, ParkedID: p.ID, MessageID: p.MessageID, MessageType: p.MessageType,
			Direction: direction(t.def, p.MessageType),
			Queue:     p.Queue, ParkClass: p.Class, Reason: p.Reason, Attempts: p.Attempts,
			Exchange: p.Exchange, RoutingKey: p.RoutingKey, ReplayedAt: p.ReplayedAt, ReplayedBy: p.ReplayedBy,
			ReplayReason: p.ReplayReason, ReplayForced: p.ReplayForced, Body: s.body(p.MessageType, p.body),
			DismissedAt: p.DismissedAt, DismissedBy: p.DismissedBy, DismissReason: p.DismissReason,
			Standing: p.Standing, StandingNote: p.StandingNote,
		}
		e.Summary = fmt.Sprintf("parked %s from %s after %d attempt(s) (%s): %s", short(p.MessageType), p.Queue, p.Attempts, p.Class, firstLine(p.Reason))
		switch {
		case p.ReplayedAt != nil:
			e.Summary += fmt.Sprintf("; replayed by %s", p.ReplayedBy)
		case p.DismissedAt != nil:
			e.Summary += fmt.Sprintf("; dismissed by %s", p.DismissedBy)
		case p.Standing != "":
			e.Summary += "; " + p.Standing
		}
		tl.Events = append(tl.Events, e)
		tl.Counts.Parked++
	}
	slices.SortStableFunc(tl.Events, func(a, b Event) int { return a.At.Compare(b.At) })
	return tl, nil
}

// newest takes rows read newest first, maxTimelineRows+1 at most, and
// returns the newest maxTimelineRows oldest first, and whether there were
// more.
func newest[T any](rows []T) ([]T, bool) {
	cut := len(rows) > maxTimelineRows
	if cut {
		rows = rows[:maxTimelineRows]
	}
	slices.Reverse(rows)
	return rows, cut
}

// direction says whether a message type is sent by the saga ("out") or
// answers it ("in").
func direction(def *sagadef.Definition, typ string) string {
	ref, ok := def.Lookup(typ)
	if !ok {
		return ""
	}
	switch ref.Use {
	case sagadef.UseCommand, sagadef.UseCompensation:
		return "out"
	default:
		return "in"
	}
}

// short drops the package of a full message name.
func short(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[i+1:]
	}
	return full
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func transitionSummary(a saga.AuditRecord) string {
	cause := a.Trigger
	switch {
	case a.Operator != "":
		cause = fmt.Sprintf("%s by %s", a.Trigger, a.Operator)
	case a.MessageID != "":
		cause = fmt.Sprintf("%s %s", short(a.Trigger), a.MessageID)
	}
	move := a.To
	if a.From != "" && a.From != a.To {
		move = a.From + " → " + a.To
	} else if a.From == a.To {
		move = "stays " + a.To
	}
	s := fmt.Sprintf("%s: %s [%s]", move, cause, a.Class)
	if a.Note != "" {
		s += " — " + firstLine(a.Note)
	}
	return s
}

// canArrive reports whether a message of the given trigger can still reach
// an instance with progress p: a reply to a command or compensation it
// sent, an event of an External step (which needs no command), or a
// message that belongs to no step. The table lists, from an ended state,
// what every step's late messages would do; an instance can only get
// those of the commands it sent.
func canArrive(def *sagadef.Definition, p sagadef.Progress, trigger string) bool {
	ref, ok := def.Lookup(trigger)
	if !ok || ref.Step == "" {
		return true
	}
	step, ok := def.LookupStep(ref.Step)
	if !ok {
		return true
	}
	sent := func(m map[string]string) bool {
		for _, s := range m {
			if s == ref.Step {
				return true
			}
		}
		return false
	}
	switch ref.Use {
	case sagadef.UseCompensationReply, sagadef.UseCompensationFailure:
		return sent(p.SentCompensations)
	case sagadef.UseSuccess, sagadef.UseFailure, sagadef.UseChildReview:
		return step.External || sent(p.Sent)
	}
	return true
}

// position says where the instance is in its definition.
func position(def *sagadef.Definition, st saga.Status, hist []saga.AuditRecord) Position {
	state, _ := def.LookupState(st.State)
	p := Position{State: st.State, Kind: state.Kind.String(), Step: state.Step, PendingMessageID: st.PendingMessageID,
		Since: st.CreatedAt}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].To == st.State && hist[i].From != hist[i].To {
			p.Since = hist[i].At.UTC()
			break
		}
	}
	if !st.TimeoutAt.IsZero() {
		at := st.TimeoutAt
		p.TimeoutAt = &at
	}
	for _, tr := range def.Transitions {
		if tr.From == st.State {
			p.Next = append(p.Next, TransitionView{Trigger: tr.Trigger, To: tr.To, Emits: tr.Emits})
		}
	}
	if state.Kind == sagadef.StateKindTerminal {
		p.Next = slices.DeleteFunc(p.Next, func(n TransitionView) bool { return !canArrive(def, st.Progress, n.Trigger) })
	}
	// In manual review the table lists a retry to every state a saga can be
	// reviewed from; this instance resumes the one it came from.
	if from := st.Progress.ReviewFrom; state.Kind == sagadef.StateKindManualReview && from != "" {
		resumes := slices.ContainsFunc(p.Next, func(n TransitionView) bool {
			return n.Trigger == sagadef.TriggerOperatorRetry && n.To == from
		})
		if resumes {
			p.Next = slices.DeleteFunc(p.Next, func(n TransitionView) bool {
				return n.Trigger == sagadef.TriggerOperatorRetry && n.To != from
			})
		}
	}
	step, hasStep := def.LookupStep(state.Step)
	if hasStep {
		p.Role = step.Role.String()
		p.Attempt, p.MaxAttempts = st.Attempt, max(step.MaxAttempts, 1)
		p.OnTimeout, p.LateReply = step.OnTimeout.String(), step.Late.String()
		after := false
		for _, s := range def.Steps {
			if after {
				p.Remaining = append(p.Remaining, s.Name)
			}
			after = after || s.Name == step.Name
		}
	}
	since := p.Since.Format(time.RFC3339)
	switch state.Kind {
	case sagadef.StateKindStep:
		p.WaitingFor = append(slices.Clone(step.SuccessReplies), step.FailureReplies...)
		what := "the reply to " + short(step.Command)
		if step.External {
			what = "event " + strings.Join(shorts(p.WaitingFor), " or ")
		}
		p.Summary = fmt.Sprintf("step %s (%s) waits for %s since %s, attempt %d of %d", step.Name, p.Role, what, since, p.Attempt, p.MaxAttempts)
		if p.TimeoutAt != nil {
			p.Summary += fmt.Sprintf("; on timeout at %s: %s", p.TimeoutAt.Format(time.RFC3339), p.OnTimeout)
		}
		if len(p.Remaining) > 0 {
			p.Summary += "; then " + strings.Join(p.Remaining, ", ")
		}
	case sagadef.StateKindGroup:
		groupPosition(def, &p, state.Group, st.Progress.Group, since)
	case sagadef.StateKindCompensating:
		p.WaitingFor = append([]string{step.CompensationReply}, step.CompensationFailureReplies...)
		p.Summary = fmt.Sprintf("compensating %s: waits for %s since %s, attempt %d of %d", step.Name, short(step.CompensationReply), since, p.Attempt, p.MaxAttempts)
		if p.TimeoutAt != nil {
			then := "resent"
			if p.Attempt >= p.MaxAttempts {
				then = "manual review"
			}
			p.Summary += fmt.Sprintf("; %s on timeout at %s", then, p.TimeoutAt.Format(time.RFC3339))
		}
	case sagadef.StateKindManualReview:
		p.WaitingFor = []string{"operator"}
		p.Summary = fmt.Sprintf("in manual review since %s: %s", since, st.ReviewReason)
		if st.Progress.ReviewFrom != "" {
			p.Summary += fmt.Sprintf(" (came from %s; retry resumes it)", st.Progress.ReviewFrom)
		}
	case sagadef.StateKindTerminal:
		p.Summary = fmt.Sprintf("ended %s at %s", st.State, since)
	default:
		p.Summary = fmt.Sprintf("state %s is not a state of %s (removed from the contract?)", st.State, def.Name)
	}
	return p
}

func shorts(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = short(n)
	}
	return out
}
