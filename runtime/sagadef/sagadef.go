package sagadef

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
)

// Role is the structural role of a step (Garcia-Molina & Salem; Richardson 4.1).
type Role int

// Step roles.
const (
	RoleUnspecified Role = iota
	// RoleCompensatable steps commit effects a later failure must undo; they
	// declare a compensating command and its reply.
	RoleCompensatable
	// RolePivot is the point of no return: once it succeeds, the saga runs to
	// completion. At most one step is the pivot.
	RolePivot
	// RoleRetriable steps follow the pivot and are retried until they succeed.
	RoleRetriable
	// RoleCheck steps run before the pivot and leave nothing to undo (a
	// validation, a read, an approval): they have no compensation, their
	// failure compensates the compensatable steps before them, and
	// compensation passes over them. A business cancel while the saga waits
	// on one compensates, as before any compensatable step.
	RoleCheck
)

// TimeoutAction says what a step's timeout does.
type TimeoutAction int

// Timeout actions.
const (
	TimeoutUnspecified TimeoutAction = iota
	// TimeoutCompensate treats the timeout as a business failure of the step.
	TimeoutCompensate
	// TimeoutRetry resends the step's command (same idempotency key) until
	// the step's attempt budget is spent, then goes to manual review.
	TimeoutRetry
	// TimeoutManualReview parks the saga in MANUAL_REVIEW for an operator.
	TimeoutManualReview
)

// LatePolicy says what a reply or event its step no longer waits for does
// where the late-reply table leaves the choice to the step: for the answer
// to an earlier attempt while the step waits for a later one, and for a
// message that contradicts what the saga does after the step stopped
// waiting (a success while it compensates or after it failed, a failure
// after it completed). Elsewhere the table decides alone: in manual review
// a late message is recorded, and one that agrees with the saga is audited
// (docs/options.md, "Late replies").
type LatePolicy int

// Late-reply policies.
const (
	LateUnspecified LatePolicy = iota
	// LateIgnore acknowledges the message, records it in the audit trail
	// and changes nothing.
	LateIgnore
	// LateManualReview records the message and sends the saga to
	// MANUAL_REVIEW.
	LateManualReview
	// LateApplyIfWaiting applies the answer to an earlier attempt while
	// the step waits for a later one (a reply to a retried command);
	// otherwise it is as LateIgnore.
	LateApplyIfWaiting
)

// Step is one step of a saga, in contract order.
type Step struct {
	// Name is the step's stable name (CamelCase, unique within the saga).
	// State names derive from it and are stored in the database: renaming a
	// step is a breaking change.
	Name string
	Role Role
	// Command is the full name of the command the step sends. Empty for a
	// step that waits for an external event (see External).
	Command string
	// External marks a step that sends nothing and waits for one of
	// SuccessReplies/FailureReplies as an event (e.g. a human approval).
	External bool
	// SuccessReplies complete the step; FailureReplies are business failures.
	SuccessReplies []string
	FailureReplies []string
	// Compensation and CompensationReply are set for compensatable steps.
	// CompensationFailureReplies, when received, send the saga to manual
	// review (a compensation that cannot be applied needs a human).
	Compensation               string
	CompensationReply          string
	CompensationFailureReplies []string
	// Timeout bounds the wait for a reply; OnTimeout says what happens then.
	Timeout   time.Duration
	OnTimeout TimeoutAction
	// MaxAttempts bounds how many times the command (or its compensation) is
	// sent, the first time included. 0 means 1.
	MaxAttempts int
	// Late says what a late reply does.
	Late LatePolicy
	// Conditional marks a step the saga may skip: each time the saga
	// reaches it going forward, the hooks' [Skipper] decides from the saga
	// data whether it runs. A skipped step sends nothing, is recorded in
	// Progress.Skipped with the decider's reason in the audit note, and is
	// never compensated. The pivot is never conditional.
	Conditional bool
	// ChildReview is the full name of the child's manual-review reply
	// (Replies.ManualReview of the child); empty when it declares none.
	ChildReview string
	// Child is the full name of the saga the step starts (a child step):
	// Command is the child's start message, the step's replies are the
	// child's outcome replies (Definition.Replies of the child) and its
	// compensation, if any, is the child's cancel. Empty for other steps.
	Child string
	// Group names the parallel group (Definition.Groups) the step belongs
	// to; empty when it runs alone. A group's members are consecutive
	// steps, sent together and joined when all succeed.
	Group string
}

// Group is a parallel group: consecutive steps that do not depend on one
// another, dispatched together in one transition and joined when every
// member succeeded. The saga waits in one state named after the group
// ([StateName] of its name) while members are outstanding; Progress.Group
// holds each waiting member's pending command, attempt and timeout.
//
// A member's failure (a failure reply, or its timeout that compensates) or
// the group's Timeout stops the members still waiting; the completed and
// the stopped compensatable members, in reverse contract order, then the
// compensatable steps before the group, are compensated one at a time. A
// member's own timeout that retries resends only its command. Members are
// neither External nor Conditional, and the pivot is never a member.
type Group struct {
	// Name is the group's stable name (CamelCase, unique among steps and
	// groups); its state name derives from it and is stored.
	Name string
	// Timeout bounds the wait for all members, from entering the group.
	Timeout time.Duration
}

// Skipper decides whether a conditional step (Step.Conditional) runs. The
// hooks of a definition with conditional steps implement it; generated code
// calls the typed Skip<Step> method of the saga's decider.
type Skipper interface {
	// Skip reports whether step (its name) is skipped for the saga data,
	// and why (recorded in the audit trail).
	Skip(ctx context.Context, step string, data proto.Message) (skip bool, reason string, err error)
}

// Definition is one saga type. Generated code builds it; call
// [Definition.Compile] once before use. A compiled Definition is read-only
// and safe for concurrent use; Compile itself must not run concurrently with
// anything else on the same Definition.
type Definition struct {
	// Name is the saga type's full name (e.g. "shop.order.v1.PlaceOrder").
	Name string
	// Table is the PostgreSQL table holding its instances.
	Table string
	// StartMessage is the full name of the message that starts an instance.
	StartMessage string
	// DataMessage is the full name of the saga data message (stored as
	// protobuf bytes).
	DataMessage string
	// Deadline bounds the whole saga; 0 means none. Past it, a waiting saga
	// goes to MANUAL_REVIEW.
	Deadline time.Duration
	// Steps in contract order.
	Steps []Step
	// Groups are the saga's parallel groups; steps name theirs in
	// Step.Group.
	Groups []Group
	// Cancel is the saga's business cancellation; the zero value declares
	// none.
	Cancel Cancel
	// Callback declares the outcomes delivered to clients as HTTP
	// callbacks; the zero value declares none.
	Callback Callback
	// Replies names the replies the saga sends to a parent saga that
	// started it from a child step; the zero value declares none.
	Replies Replies
	// States and Transitions are the complete state set and transition
	// table; [Definition.Compile] fills them from Steps.
	States      []State
	Transitions []Transition

	// compiled is the index Compile builds; nil until Compile succeeds.
	compiled *index
}

// Cancel declares a saga's business cancellation: a message (a command the
// saga's own queue receives, or an event) asking to stop an instance. While
// the saga waits on a compensatable step or the pivot, it stops waiting and
// compensates the completed compensatable steps in reverse order, as a
// business failure does, and ends CANCELLED instead of FAILED. Past the
// point of no return (a pivot or retriable step completed, or the saga
// waits on a retriable step) it is refused; while the saga compensates, has
// ended, or is in manual review it changes nothing. Either way the audit
// trail records who asked and why.
type Cancel struct {
	// Message is the full name of the cancel message. Empty: the saga
	// declares no business cancellation.
	Message string
	// RequestedBy and Reason are field paths in Message (proto field names
	// joined with dots, e.g. "requested_by" or "request.user") whose values
	// say who asked and why. Empty: not recorded.
	RequestedBy string
	Reason      string
}

// Terminal and holding states every saga has. Step states are derived from
// step names: "RESERVE_INVENTORY" waits for the step's reply,
// "COMPENSATING_RESERVE_INVENTORY" waits for its compensation's reply.
const (
	StateCompleted    = "COMPLETED"
	StateFailed       = "FAILED" // ended by a business failure, compensations done
	StateCancelled    = "CANCELLED"
	StateManualReview = "MANUAL_REVIEW"
)

// StateKind classifies states.
type StateKind int

// State kinds.
const (
	StateKindUnspecified  StateKind = iota
	StateKindStep                   // waiting for a step's reply or event
	StateKindCompensating           // waiting for a compensation's reply
	StateKindManualReview
	StateKindTerminal
	StateKindGroup // waiting for the members of a parallel group
)

// State is one state of a saga type.
type State struct {
	Name string
	Kind StateKind
	// Step is the step this state belongs to (empty for terminal/manual
	// review and group states).
	Step string
	// Group is the parallel group a StateKindGroup state waits on.
	Group string
}

// Trigger kinds for transitions. A transition's Trigger is either one of
// these or a message full name; Compile refuses message names equal to them.
const (
	// TriggerStart is the trigger of the table's initial row (From "").
	TriggerStart    = "start"
	TriggerTimeout  = "timeout"
	TriggerDeadline = "deadline"
	// TriggerStuck sends a saga to manual review whose due timeout or
	// deadline could not be applied too many times in a row (a hook or
	// the database kept failing, or the saga data cannot be decoded):
	// Progress.Deferrals counts them. Trigger.Reason says why.
	TriggerStuck = "stuck"
	// Operator triggers (audited with who and why).
	TriggerOperatorRetry      = "operator.retry"
	TriggerOperatorCompensate = "operator.compensate"
	TriggerOperatorResolve    = "operator.resolve"
	TriggerOperatorCancel     = "operator.cancel"
)

// Transition is one row of the transition table. Trigger is a message full
// name or one of the Trigger* constants.
type Transition struct {
	From    string
	Trigger string
	To      string
	// Emits lists the full names of messages the transition sends.
	Emits []string
}

// Class is the classification of an incoming trigger against an instance.
type Class int

// Classes.
const (
	ClassUnspecified Class = iota
	// ClassNew is expected in the current state and is applied.
	ClassNew
	// ClassDuplicate repeats an outcome already applied; no effect.
	ClassDuplicate
	// ClassLate answers a wait that already ended; the late-reply table
	// (and the step's LatePolicy) decides what it does.
	ClassLate
	// ClassConflicting contradicts an outcome already applied; the saga goes
	// to manual review, never transitions blindly.
	ClassConflicting
	// ClassInvalid is not part of this saga's conversation in any state it
	// has been in; audited, no effect.
	ClassInvalid
	// ClassEarly is an External step's event that arrives while the saga
	// is still on its way to the step: recorded (the state unchanged), it
	// settles the step when the saga enters it, and is discarded when the
	// saga compensates, skips the step or ends first.
	ClassEarly
)

// Instance is the persisted state of one saga instance, as the machine sees it.
type Instance struct {
	ID          string
	Type        string
	BusinessKey string
	State       string
	Version     int64
	// Data is the decoded saga data message.
	Data proto.Message
	// Attempt is the number of times the current step's command (or
	// compensation) has been sent; 0 in a group state, where
	// Progress.Group holds each member's.
	Attempt int
	// PendingMessageID is the MessageID of the command the saga waits on;
	// empty in a group state, where Progress.Group holds each member's.
	PendingMessageID string
	// Progress records per-step outcomes; it is persisted as JSON.
	Progress   Progress
	TimeoutAt  time.Time // zero: no timeout armed
	DeadlineAt time.Time // zero: no deadline
	LastError  string
	// ReviewReason says why the saga is in MANUAL_REVIEW.
	ReviewReason string
}

// Progress is the per-step memory that classification needs.
type Progress struct {
	// Completed lists steps that succeeded, in order.
	Completed []string `json:"completed,omitempty"`
	// Compensated lists steps whose compensation succeeded, in order.
	Compensated []string `json:"compensated,omitempty"`
	// Outcomes maps step name to the full name of the reply that settled it.
	Outcomes map[string]string `json:"outcomes,omitempty"`
	// Sent maps command MessageIDs the saga sent to their step name, so a
	// reply's causation id identifies the attempt it answers.
	Sent map[string]string `json:"sent,omitempty"`
	// Skipped lists conditional steps the decider skipped, in order.
	Skipped []string `json:"skipped,omitempty"`
	// Stopped lists steps whose wait ended without a reply (timeout,
	// operator compensate/cancel/resolve). A compensatable step in Stopped is
	// compensated: its effect may have happened.
	Stopped []string `json:"stopped,omitempty"`
	// SentCompensations maps compensating command MessageIDs to the step
	// they compensate, like Sent does for step commands.
	SentCompensations map[string]string `json:"sent_compensations,omitempty"`
	// CompensationOutcomes maps step name to the full name of the reply that
	// settled its compensation.
	CompensationOutcomes map[string]string `json:"compensation_outcomes,omitempty"`
	// ReviewFrom is the state the saga was in when it entered
	// MANUAL_REVIEW: what an operator retry resumes. Empty outside review.
	ReviewFrom string `json:"review_from,omitempty"`
	// OperatorRetries counts, by command full name, an operator's retries
	// (and compensates) of a command after its step or compensation
	// recorded a failure; the command is sent with the count
	// (Outgoing.OperatorRetry) from then on.
	OperatorRetries map[string]int `json:"operator_retries,omitempty"`
	// Deferrals counts the times in a row the timeout scanner failed to
	// apply a due timeout or deadline (see TriggerStuck); any applied
	// transition resets it.
	Deferrals int `json:"deferrals,omitempty"`
	// Cancel records the business cancel (Definition.Cancel) the saga
	// applied: the compensation it started ends CANCELLED rather than
	// FAILED. An operator's retry that resumes the forward path clears it.
	Cancel *Cancellation `json:"cancel,omitempty"`
	// Parent is the saga whose child step started the instance; nil when
	// none did. The engine addresses the outcome replies (Definition.Replies)
	// to it.
	Parent *Parent `json:"parent,omitempty"`
	// ChildReview is set while the saga waits on a child step whose child
	// said it is in manual review.
	ChildReview *ChildReview `json:"child_review,omitempty"`
	// Group is the parallel group the saga waits on (in its group state),
	// or waited on when it entered manual review: its members still
	// waiting, each with its pending command. Nil elsewhere.
	Group *GroupProgress `json:"group,omitempty"`
}

// GroupProgress is the wait on a parallel group.
type GroupProgress struct {
	// Name is the group's name.
	Name string `json:"name"`
	// TimeoutAt is when the group's own timeout fires.
	TimeoutAt time.Time `json:"timeout_at"`
	// Members lists the members still waiting, in contract order; a member
	// leaves it when it succeeds.
	Members []MemberProgress `json:"members,omitempty"`
}

// MemberProgress is one waiting member of a parallel group.
type MemberProgress struct {
	// Step is the member's step name.
	Step string `json:"step"`
	// Pending is the MessageID of the member's command the saga waits on.
	Pending string `json:"pending"`
	// Attempt is the number of times its command has been sent.
	Attempt int `json:"attempt"`
	// TimeoutAt is when the member's own timeout fires.
	TimeoutAt time.Time `json:"timeout_at"`
}

// Cancellation is a business cancel the saga applied: who asked, why, and
// the cancel message's id.
type Cancellation struct {
	RequestedBy string `json:"requested_by,omitempty"`
	Reason      string `json:"reason,omitempty"`
	MessageID   string `json:"message_id,omitempty"`
}

// Trigger is what happens to an instance: a message, a timeout, an operator.
type Trigger struct {
	// Kind is a message full name or one of the Trigger* constants.
	Kind string
	// Message is the decoded message for message triggers.
	Message message.Message
	// MessageID and CausationID come from the envelope.
	MessageID   string
	CausationID string
	// Operator and Reason are set for operator triggers; Reason also says
	// why for TriggerStuck. For the cancel message (Definition.Cancel) they
	// are who asked and why; when empty, Apply reads them from the
	// message's RequestedBy and Reason fields.
	Operator string
	Reason   string
	// ResolveTo is the target state for TriggerOperatorResolve.
	ResolveTo string
	// Once is set for a reply from a participant that runs each command
	// once and records a command as done when its compensation comes first
	// (message.HeaderOnce): its late success for a step whose
	// compensation was sent had its effect undone by that compensation.
	Once bool
}

// Hooks are the business decisions the user implements (through a typed,
// generated interface): start data, commands built from saga data, and
// replies folded into saga data.
type Hooks interface {
	// Start builds the saga data and business key from the start message.
	Start(ctx context.Context, start message.Message) (data proto.Message, businessKey string, err error)
	// Build returns the command of the given full name for the saga data.
	Build(ctx context.Context, command string, data proto.Message) (message.Message, error)
	// Apply folds a reply or event into the saga data.
	Apply(ctx context.Context, data proto.Message, msg message.Message) error
}

// Result is what [Definition.Apply] decided.
type Result struct {
	Class Class
	From  string
	To    string
	// Instance is the instance after the transition (unchanged fields kept).
	Instance Instance
	// Emit lists the messages to write to the outbox, in order. Their
	// MessageIDs are already recorded in Instance.Progress.Sent.
	Emit []Outgoing
	// Note is a one-line human explanation for the audit trail.
	Note string
	// ReasonNoted says Note already says the trigger's reason (an
	// operator's action, a cancel, a child's review), so whoever records
	// it need not add Trigger.Reason again.
	ReasonNoted bool
}

// Outgoing is one message a transition sends.
type Outgoing struct {
	MessageID string
	Message   message.Message
	// OperatorRetry is Progress.OperatorRetries of the command: above 0,
	// an operator retried or compensated again after a recorded failure,
	// and the engine says so in the envelope (message.HeaderOperatorRetry).
	OperatorRetry int
	// Compensates is set on a compensating command for a step that stopped
	// waiting without an answer: the once key (message.OnceKey) of the
	// step's command, which may still be on its way (message.HeaderCompensates).
	Compensates string
}

// Env is what [Definition.Apply] needs from outside: the clock, an id source
// and the user's hooks. Tests inject a fixed clock and sequential ids.
type Env struct {
	Now   time.Time
	NewID func() string
	Hooks Hooks
}
