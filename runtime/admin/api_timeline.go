package admin

import (
	"time"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Timeline is one saga's story (GET /api/sagas/{id}): the instance, where it
// stands in its definition, and every transition, message and parked message
// that concerns it, oldest first.
type Timeline struct {
	Saga Saga `json:"saga"`
	// Data is the saga data, redacted like message bodies.
	Data     *Body        `json:"data,omitempty"`
	Position Position     `json:"position"`
	States   []StateView  `json:"states"`
	Steps    []StepView   `json:"steps"`
	Mermaid  string       `json:"mermaid"`
	Events   []Event      `json:"events"`
	Progress ProgressView `json:"progress"`
	// Actions are the repairs and what each would do now, as the state
	// machine decides: the console offers only those Allowed.
	Actions []ActionView  `json:"actions"`
	Counts  TimelineCount `json:"counts"`
	// Truncated is set when the saga has more audit rows, sent messages or
	// parked messages than a timeline holds (1000 of each): Events then
	// holds the newest of each, and the visited states, counts and attempt
	// numbers cover only those.
	Truncated bool `json:"truncated,omitempty"`
}

// ActionView is one repair of a saga as the state machine judges it in the
// saga's current state (resolve once per target state).
type ActionView struct {
	Action string `json:"action"`
	// To is the target of resolve.
	To      string `json:"to,omitempty"`
	Allowed bool   `json:"allowed"`
	// Reaches is the state the saga would be in afterwards, Sends the
	// messages it would send (short names).
	Reaches string   `json:"reaches,omitempty"`
	Sends   []string `json:"sends,omitempty"`
	// Effect says what the repair would do, in one sentence; Refusal why
	// the machine refuses it.
	Effect  string `json:"effect,omitempty"`
	Refusal string `json:"refusal,omitempty"`
}

// ProgressView summarises the instance's per-step memory.
type ProgressView struct {
	Completed   []string `json:"completed,omitempty"`
	Compensated []string `json:"compensated,omitempty"`
	Stopped     []string `json:"stopped,omitempty"`
	// Parent is the saga whose child step started the instance; nil when
	// none did.
	Parent *sagadef.Parent `json:"parent,omitempty"`
	// ChildReview is set while the saga waits on a child step whose child
	// said it is in manual review: the step and the child's account.
	ChildReview *sagadef.ChildReview `json:"child_review,omitempty"`
	// Cancel is the business cancel the saga holds: the one that started
	// its compensation, or one that came while it was in manual review
	// (recorded for the operator: a compensation then ends CANCELLED and
	// answers a parent that asked).
	Cancel *sagadef.Cancellation `json:"cancel,omitempty"`
}

// TimelineCount counts what the timeline holds.
type TimelineCount struct {
	Transitions int `json:"transitions"`
	MessagesOut int `json:"messages_out"`
	MessagesIn  int `json:"messages_in"`
	Parked      int `json:"parked"`
	// Retries counts resent commands (attempts beyond the first of a step).
	Retries int `json:"retries"`
}

// Position says where an instance is in its definition: what it waits for
// since when, until when, and what can happen next.
type Position struct {
	State string `json:"state"`
	Kind  string `json:"kind"`
	Step  string `json:"step,omitempty"`
	Role  string `json:"role,omitempty"`
	// Summary is one sentence for a human.
	Summary string `json:"summary"`
	// WaitingFor lists the messages (or "operator") that move the saga on.
	WaitingFor       []string   `json:"waiting_for,omitempty"`
	PendingMessageID string     `json:"pending_message_id,omitempty"`
	Attempt          int        `json:"attempt,omitempty"`
	MaxAttempts      int        `json:"max_attempts,omitempty"`
	Since            time.Time  `json:"since"`
	TimeoutAt        *time.Time `json:"timeout_at,omitempty"`
	OnTimeout        string     `json:"on_timeout,omitempty"`
	LateReply        string     `json:"late_reply,omitempty"`
	// Remaining lists the steps after the current one, in order.
	Remaining []string `json:"remaining,omitempty"`
	// Group is the parallel group the saga waits on, and Members its
	// members still waiting, each with its pending command.
	Group   string       `json:"group,omitempty"`
	Members []MemberView `json:"members,omitempty"`
	// Next lists the transitions the definition allows from this state.
	Next []TransitionView `json:"next,omitempty"`
}

// TransitionView is one row of the transition table.
type TransitionView struct {
	Trigger string   `json:"trigger"`
	To      string   `json:"to"`
	Emits   []string `json:"emits,omitempty"`
}

// Event kinds in a timeline.
const (
	EventTransition = "transition" // a saga_audit row
	EventMessage    = "message"    // a saga_outbox row of the saga
	EventParked     = "parked"     // a saga_parked row of the saga
)

// Event is one entry of a timeline. Kind says which fields are set.
type Event struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	// Summary is one line for a human.
	Summary string `json:"summary"`

	// Transitions (saga_audit).
	AuditID     int64  `json:"audit_id,omitempty"`
	From        string `json:"from,omitempty"`
	To          string `json:"to,omitempty"`
	Trigger     string `json:"trigger,omitempty"`
	Class       string `json:"class,omitempty"`
	MessageID   string `json:"message_id,omitempty"`
	CausationID string `json:"causation_id,omitempty"`
	Operator    string `json:"operator,omitempty"`
	Note        string `json:"note,omitempty"`
	Version     int64  `json:"version,omitempty"`

	// Messages (saga_outbox) and parked messages.
	Direction       string     `json:"direction,omitempty"` // "out" (sent by the saga) or "in" (to it)
	MessageType     string     `json:"message_type,omitempty"`
	Exchange        string     `json:"exchange,omitempty"`
	RoutingKey      string     `json:"routing_key,omitempty"`
	PublishedAt     *time.Time `json:"published_at,omitempty"`
	PublishAttempts int        `json:"publish_attempts,omitempty"`
	// ReceivedAt, for a message to the saga: when the saga applied it (the
	// first transition that names it); nil while it has not.
	ReceivedAt *time.Time `json:"received_at,omitempty"`
	// Outside: a message to the saga listed from the transition that
	// applied it, its outbox row not being in this database (no
	// publication, exchange or body to show).
	Outside bool  `json:"outside,omitempty"`
	Body    *Body `json:"body,omitempty"`

	// Parked messages.
	ParkedID     int64      `json:"parked_id,omitempty"`
	Queue        string     `json:"queue,omitempty"`
	ParkClass    string     `json:"park_class,omitempty"`
	Reason       string     `json:"reason,omitempty"`
	Attempts     int        `json:"attempts,omitempty"`
	ReplayedAt   *time.Time `json:"replayed_at,omitempty"`
	ReplayedBy   string     `json:"replayed_by,omitempty"`
	ReplayReason string     `json:"replay_reason,omitempty"`
	ReplayForced bool       `json:"replay_forced,omitempty"`
	// DismissedAt, DismissedBy and DismissReason: a dismissed parked copy.
	DismissedAt   *time.Time `json:"dismissed_at,omitempty"`
	DismissedBy   string     `json:"dismissed_by,omitempty"`
	DismissReason string     `json:"dismiss_reason,omitempty"`
	// Standing and StandingNote: an open parked copy (Parked.Standing).
	Standing     string `json:"standing,omitempty"`
	StandingNote string `json:"standing_note,omitempty"`
}

// Actions on one saga (POST /api/sagas/{id}/{action}).
const (
	ActionRetry      = "retry"
	ActionCompensate = "compensate"
	ActionResolve    = "resolve"
	ActionCancel     = "cancel"
)
