package admin

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/protosaga/saga/runtime/sagadef"
)

// MemberView is a member of a parallel group the saga still waits on.
type MemberView struct {
	Step             string    `json:"step"`
	PendingMessageID string    `json:"pending_message_id"`
	Attempt          int       `json:"attempt"`
	MaxAttempts      int       `json:"max_attempts"`
	TimeoutAt        time.Time `json:"timeout_at"`
	OnTimeout        string    `json:"on_timeout"`
}

// groupPosition fills p for a saga waiting on a parallel group: the
// members still waiting (their replies are what moves it on), the group's
// timeout and the steps after the group.
func groupPosition(def *sagadef.Definition, p *Position, group string, gp *sagadef.GroupProgress, since string) {
	p.Group = group
	members := def.Members(group)
	var waiting []string
	if gp != nil {
		for _, m := range gp.Members {
			s, ok := def.LookupStep(m.Step)
			if !ok {
				continue
			}
			p.Members = append(p.Members, MemberView{Step: m.Step, PendingMessageID: m.Pending, Attempt: m.Attempt,
				MaxAttempts: max(s.MaxAttempts, 1), TimeoutAt: m.TimeoutAt.UTC(), OnTimeout: s.OnTimeout.String()})
			p.WaitingFor = append(p.WaitingFor, s.SuccessReplies...)
			p.WaitingFor = append(p.WaitingFor, s.FailureReplies...)
			waiting = append(waiting, fmt.Sprintf("%s (attempt %d of %d)", m.Step, m.Attempt, max(s.MaxAttempts, 1)))
		}
	}
	p.Summary = fmt.Sprintf("group %s (%s) waits for %s since %s", group, strings.Join(members, ", "),
		strings.Join(waiting, ", "), since)
	if gp != nil {
		p.Summary += fmt.Sprintf("; the group times out at %s", gp.TimeoutAt.UTC().Format(time.RFC3339))
	}
	if len(members) > 0 {
		last := members[len(members)-1]
		i := slices.IndexFunc(def.Steps, func(s sagadef.Step) bool { return s.Name == last })
		for _, s := range def.Steps[i+1:] {
			p.Remaining = append(p.Remaining, s.Name)
		}
		if len(p.Remaining) > 0 {
			p.Summary += "; then " + strings.Join(p.Remaining, ", ")
		}
	}
}
