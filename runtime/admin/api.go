package admin

import (
	"encoding/json"
	"time"
)

// The JSON documents of the admin API. Clients (sagactl, the console) decode
// these; fields are only ever added.

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	// Code is a stable, machine-readable kind: bad_request, unauthenticated,
	// forbidden, not_found, version_conflict, rejected, refused,
	// method_not_allowed, too_large, rate_limited, internal.
	Code string `json:"code"`
	// Message says what is wrong, for a human.
	Message string `json:"error"`
	// Detail carries structured context (e.g. the versions of a conflict).
	Detail any `json:"detail,omitempty"`
}

// WhoAmI answers GET /api/whoami.
type WhoAmI struct {
	Principal Principal `json:"principal"`
}

// SagaType describes one saga type the server serves (GET /api/types).
type SagaType struct {
	Name   string      `json:"name"`
	Table  string      `json:"table"`
	States []StateView `json:"states"`
	Steps  []StepView  `json:"steps"`
	// Mermaid is the transition table as a Mermaid stateDiagram-v2.
	Mermaid string `json:"mermaid"`
}

// StepView is one step of a saga definition.
type StepView struct {
	Name           string   `json:"name"`
	Role           string   `json:"role"`
	Command        string   `json:"command,omitempty"`
	External       bool     `json:"external,omitempty"`
	SuccessReplies []string `json:"success_replies,omitempty"`
	FailureReplies []string `json:"failure_replies,omitempty"`
	Compensation   string   `json:"compensation,omitempty"`
	Timeout        string   `json:"timeout,omitempty"`
	OnTimeout      string   `json:"on_timeout,omitempty"`
	MaxAttempts    int      `json:"max_attempts"`
	Late           string   `json:"late_reply"`
}

// StateView is one state of a saga definition; in a timeline, Current and
// Visited place the instance in it.
type StateView struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Step    string `json:"step,omitempty"`
	Current bool   `json:"current,omitempty"`
	Visited bool   `json:"visited,omitempty"`
}

// Saga is one saga instance as listed (GET /api/sagas).
type Saga struct {
	ID               string     `json:"id"`
	Type             string     `json:"type"`
	BusinessKey      string     `json:"business_key"`
	State            string     `json:"state"`
	StateKind        string     `json:"state_kind"`
	Step             string     `json:"step,omitempty"`
	Version          int64      `json:"version"`
	Attempt          int        `json:"attempt"`
	PendingMessageID string     `json:"pending_message_id,omitempty"`
	TimeoutAt        *time.Time `json:"timeout_at,omitempty"`
	DeadlineAt       *time.Time `json:"deadline_at,omitempty"`
	// LastError is the last business failure or timeout while the saga
	// ran. A saga that COMPLETED or was CANCELLED shows none (its timeline
	// keeps every error); a FAILED one shows why it failed.
	LastError    string `json:"last_error,omitempty"`
	ReviewReason string `json:"review_reason,omitempty"`
	// ReviewFrom is the state the saga was in when it entered manual review.
	ReviewFrom string    `json:"review_from,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Stuck is set when the saga is stuck by telemetry.StuckRule (the rule
	// of the saga.instances.stuck gauge): its timeout or deadline is past
	// due, or it has not changed for longer than the step's timeout, by
	// more than the grace. StuckReason says which.
	Stuck       bool   `json:"stuck,omitempty"`
	StuckReason string `json:"stuck_reason,omitempty"`
}

// SagaPage is one page of sagas, newest first. NextCursor is empty on the
// last page.
type SagaPage struct {
	Items      []Saga `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// Parked is one parked message joined to its saga (GET /api/parked).
type Parked struct {
	ID            int64  `json:"id"`
	MessageID     string `json:"message_id"`
	Queue         string `json:"queue"`
	MessageType   string `json:"message_type"`
	SagaID        string `json:"saga_id,omitempty"`
	SagaType      string `json:"saga_type,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// BusinessKey, SagaState and Step come from the saga instance and its
	// definition; empty when the saga is unknown to this server.
	BusinessKey string `json:"business_key,omitempty"`
	SagaState   string `json:"saga_state,omitempty"`
	Step        string `json:"step,omitempty"`
	// Class is "permanent" (parked at once) or "exhausted" (retries spent).
	Class      string `json:"class"`
	Reason     string `json:"reason"`
	Attempts   int    `json:"attempts"`
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	// FirstFailureAt is the first failed attempt, ParkedAt the last.
	FirstFailureAt time.Time  `json:"first_failure_at"`
	ParkedAt       time.Time  `json:"parked_at"`
	ReplayedAt     *time.Time `json:"replayed_at,omitempty"`
	ReplayedBy     string     `json:"replayed_by,omitempty"`
	// ReplayReason is the operator's reason for the replay, and
	// ReplayForced is set when it was forced past a refused saga-state
	// check (empty for rows replayed before runtime migration 0009).
	ReplayReason string `json:"replay_reason,omitempty"`
	ReplayForced bool   `json:"replay_forced,omitempty"`
	// DismissedAt, DismissedBy and DismissReason say who closed the row
	// without replaying it, when and why.
	DismissedAt   *time.Time `json:"dismissed_at,omitempty"`
	DismissedBy   string     `json:"dismissed_by,omitempty"`
	DismissReason string     `json:"dismiss_reason,omitempty"`
	// LinkedBy is "correlation" when the message named no saga and was
	// joined to the saga whose business key (or id) its correlation field
	// holds, as the saga's consumer finds it.
	LinkedBy string `json:"linked_by,omitempty"`
	// Standing says whether an open copy still applies to its saga:
	// StandingCurrent (replaying it would act: the saga waits for it),
	// StandingSuperseded (it no longer applies: the saga resent the
	// command since, moved past its step or ended; dismiss it), or empty
	// when it cannot be told (no saga, or one this server does not
	// serve). StandingNote says why.
	Standing     string `json:"standing,omitempty"`
	StandingNote string `json:"standing_note,omitempty"`
	// Body is set on GET /api/parked/{id} only.
	Body *Body `json:"body,omitempty"`
}

// Standings of an open parked copy (Parked.Standing).
const (
	StandingCurrent    = "current"
	StandingSuperseded = "superseded"
)

// ParkedPage is one page of parked messages, newest first.
type ParkedPage struct {
	Items      []Parked `json:"items"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// Body is a message body as shown to operators: decoded through the message
// registry into protojson (proto field names) with the contract's sensitive
// fields replaced by "[REDACTED]", or only its size when the type is unknown
// or the body does not decode.
type Body struct {
	Type string `json:"type"`
	Size int    `json:"size"`
	// JSON is the redacted body; absent when it could not be decoded.
	JSON json.RawMessage `json:"json,omitempty"`
	// Redacted lists the field paths that were replaced.
	Redacted []string `json:"redacted,omitempty"`
	// Note says why the body is not shown, when it is not.
	Note string `json:"note,omitempty"`
}

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
	Body            *Body      `json:"body,omitempty"`

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

// ActionRequest is the body of POST /api/sagas/{id}/{action}.
type ActionRequest struct {
	// ExpectedVersion is the version the operator decided on. Required: if
	// the saga has moved on, the action fails with 409 version_conflict.
	ExpectedVersion int64 `json:"expected_version"`
	// Reason is required and recorded in the audit trail.
	Reason string `json:"reason"`
	// To is the target state of resolve (COMPLETED, FAILED or CANCELLED).
	To string `json:"to,omitempty"`
	// Type optionally names the saga type (otherwise it is looked up).
	Type string `json:"type,omitempty"`
}

// Outcomes of repairs.
const (
	OutcomeApplied        = "applied"         // the action changed the saga
	OutcomeAlreadyApplied = "already_applied" // a repeat of an action that was applied: nothing done
	OutcomeWouldApply     = "would_apply"     // dry run: the machine allows it
	OutcomeWouldReject    = "would_reject"    // dry run: the machine refuses it in this state
	OutcomeConflict       = "version_conflict"
	OutcomeRejected       = "rejected"
	OutcomeError          = "error"
	OutcomeReplayed       = "replayed"         // the parked message is back in the outbox
	OutcomeAlreadyReplay  = "already_replayed" // it had been replayed before: nothing done
	OutcomeWouldReplay    = "would_replay"     // dry run: the check passes
	OutcomeRefused        = "refused"          // the saga-state check refused the replay
	OutcomeDismissed      = "dismissed"        // the parked copy is closed without a replay
	OutcomeAlreadyClosed  = "already_closed"   // it had been replayed or dismissed before: nothing done
	OutcomeWouldDismiss   = "would_dismiss"    // dry run: it would be dismissed
)

// ActionResult answers a repair of one saga.
type ActionResult struct {
	Action  string `json:"action"`
	Outcome string `json:"outcome"`
	Saga    Saga   `json:"saga"`
}

// SagaFilter selects sagas for listing and bulk actions. Stuck and Review
// narrow to stuck sagas and sagas in manual review.
type SagaFilter struct {
	Type        string `json:"type,omitempty"`
	State       string `json:"state,omitempty"`
	BusinessKey string `json:"business_key,omitempty"`
	// KeyPrefix selects business keys starting with it.
	KeyPrefix string `json:"key_prefix,omitempty"`
	Stuck     bool   `json:"stuck,omitempty"`
	Review    bool   `json:"review,omitempty"`
	// CreatedAfter, CreatedBefore, UpdatedAfter and UpdatedBefore bound
	// the creation and last-change times (exclusive; RFC 3339).
	CreatedAfter  *time.Time `json:"created_after,omitempty"`
	CreatedBefore *time.Time `json:"created_before,omitempty"`
	UpdatedAfter  *time.Time `json:"updated_after,omitempty"`
	UpdatedBefore *time.Time `json:"updated_before,omitempty"`
}

// Sort orders of a saga list (?sort=).
const (
	SortNewest = "newest" // by creation, newest first (the default)
	SortOldest = "oldest" // by creation, oldest first
)

// BulkRequest is the body of POST /api/bulk/sagas/{action}.
type BulkRequest struct {
	// Filter must name at least one criterion.
	Filter SagaFilter `json:"filter"`
	Reason string     `json:"reason"`
	To     string     `json:"to,omitempty"`
	// DryRun lists what would happen and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Max bounds how many sagas are acted on (default 100, at most 500).
	Max int `json:"max,omitempty"`
}

// BulkItem is the outcome for one saga of a bulk action.
type BulkItem struct {
	SagaID      string `json:"saga_id"`
	Type        string `json:"type"`
	BusinessKey string `json:"business_key"`
	State       string `json:"state"`
	Version     int64  `json:"version"`
	Outcome     string `json:"outcome"`
	// To is the resulting state (in a dry run, the state the saga would
	// reach), Sends the messages it sent (would send) and Effect what
	// happened (would happen) to it, in one sentence.
	To     string   `json:"to,omitempty"`
	Sends  []string `json:"sends,omitempty"`
	Effect string   `json:"effect,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// BulkResult answers a bulk action.
type BulkResult struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Truncated is set when more sagas matched than Max.
	Truncated bool           `json:"truncated,omitempty"`
	Items     []BulkItem     `json:"items"`
	Counts    map[string]int `json:"counts"`
}

// ReplayRequest is the body of POST /api/parked/{id}/replay.
type ReplayRequest struct {
	// Reason is required and recorded in the saga's audit trail.
	Reason string `json:"reason"`
	// DryRun runs the saga-state check only.
	DryRun bool `json:"dry_run,omitempty"`
	// Force replays even when the check refuses. The message still goes
	// through the normal path: inbox dedupe and the saga's classification
	// decide its effect.
	Force bool `json:"force,omitempty"`
}

// ReplayCheck is the saga-state check made before a replay.
type ReplayCheck struct {
	Allowed bool `json:"allowed"`
	// SagaState is the saga's state when checked.
	SagaState string `json:"saga_state,omitempty"`
	// Class is how the saga would classify the message now (new, duplicate,
	// late, conflicting, invalid), or "pending-command" for a command the
	// saga still waits on.
	Class       string `json:"class,omitempty"`
	Explanation string `json:"explanation"`
}

// ReplayResult answers a replay.
type ReplayResult struct {
	Outcome string      `json:"outcome"`
	Check   ReplayCheck `json:"check"`
	Parked  Parked      `json:"parked"`
	// MessageID is the id the message is republished with (its own).
	MessageID string `json:"message_id,omitempty"`
	// AlsoMarked lists other parked rows of the same message (other queues
	// bound to the same routing) marked replayed with it.
	AlsoMarked []int64 `json:"also_marked,omitempty"`
}

// ParkedFilter selects parked messages for listing and bulk replay or
// dismissal.
type ParkedFilter struct {
	SagaType string `json:"saga_type,omitempty"`
	// SagaID selects the saga's parked messages, those joined to it by
	// their correlation field included.
	SagaID      string `json:"saga_id,omitempty"`
	Queue       string `json:"queue,omitempty"`
	MessageType string `json:"message_type,omitempty"`
	// Reason selects rows whose reason contains it (case-insensitive).
	Reason string `json:"reason,omitempty"`
	// OlderThan and NewerThan bound the age of the last failure (Go
	// durations: "90s", "1h").
	OlderThan string `json:"older_than,omitempty"`
	NewerThan string `json:"newer_than,omitempty"`
	// IncludeReplayed lists closed rows too, replayed or dismissed (bulk
	// actions refuse it).
	IncludeReplayed bool `json:"include_replayed,omitempty"`
}

// BulkReplayRequest is the body of POST /api/bulk/parked/replay.
type BulkReplayRequest struct {
	Filter ParkedFilter `json:"filter"`
	Reason string       `json:"reason"`
	DryRun bool         `json:"dry_run,omitempty"`
	Max    int          `json:"max,omitempty"`
}

// BulkReplayResult answers a bulk replay.
type BulkReplayResult struct {
	DryRun    bool           `json:"dry_run"`
	Truncated bool           `json:"truncated,omitempty"`
	Items     []ReplayResult `json:"items"`
	Counts    map[string]int `json:"counts"`
}

// DismissRequest is the body of POST /api/parked/{id}/dismiss.
type DismissRequest struct {
	// Reason is required; it is recorded on the row and in the saga's
	// audit trail.
	Reason string `json:"reason"`
	// DryRun says what would happen and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Force dismisses a copy that is still current (the saga waits for
	// it): the saga then waits until its step's timeout.
	Force bool `json:"force,omitempty"`
}

// DismissResult answers a dismissal.
type DismissResult struct {
	Outcome string `json:"outcome"`
	Parked  Parked `json:"parked"`
	// Explanation says why, in one sentence.
	Explanation string `json:"explanation"`
}

// BulkDismissRequest is the body of POST /api/bulk/parked/dismiss. A bulk
// dismissal never closes a current copy.
type BulkDismissRequest struct {
	Filter ParkedFilter `json:"filter"`
	Reason string       `json:"reason"`
	DryRun bool         `json:"dry_run,omitempty"`
	Max    int          `json:"max,omitempty"`
}

// BulkDismissResult answers a bulk dismissal.
type BulkDismissResult struct {
	DryRun    bool            `json:"dry_run"`
	Truncated bool            `json:"truncated,omitempty"`
	Items     []DismissResult `json:"items"`
	Counts    map[string]int  `json:"counts"`
}

// Stats answers GET /api/stats: how many sagas are in each state of each
// type, and how many parked messages are open.
type Stats struct {
	Types  []TypeStats `json:"types"`
	Parked ParkedStats `json:"parked"`
}

// TypeStats counts one saga type's instances.
type TypeStats struct {
	Type   string       `json:"type"`
	Total  int64        `json:"total"`
	Stuck  int64        `json:"stuck"`
	States []StateCount `json:"states"`
}

// StateCount is how many instances are in one state (Stuck: how many of
// them are stuck).
type StateCount struct {
	State string `json:"state"`
	Kind  string `json:"kind"`
	Count int64  `json:"count"`
	Stuck int64  `json:"stuck,omitempty"`
}

// ParkedStats counts open parked messages.
type ParkedStats struct {
	Open    int64            `json:"open"`
	ByQueue map[string]int64 `json:"by_queue"`
}

// SearchResult answers GET /api/search?q=...: every saga and parked message
// the text names.
type SearchResult struct {
	Query string      `json:"query"`
	Hits  []SearchHit `json:"hits"`
	// Truncated is set when there were more hits than shown.
	Truncated bool `json:"truncated,omitempty"`
}

// SearchHit is one saga (or parked message) a search found, and how.
type SearchHit struct {
	// Matched says what the text matched: "saga id", "business key",
	// "business key prefix", "message id", "correlation id", "parked
	// message id".
	Matched string `json:"matched"`
	Saga    *Saga  `json:"saga,omitempty"`
	// ParkedID is set when the hit is a parked message; MessageID and
	// MessageType name the message a message-id hit found.
	ParkedID    int64  `json:"parked_id,omitempty"`
	MessageID   string `json:"message_id,omitempty"`
	MessageType string `json:"message_type,omitempty"`
}

// OperatorLog answers GET /api/operator-log: operator actions across every
// saga, newest first.
type OperatorLog struct {
	Items      []OperatorAction `json:"items"`
	NextCursor string           `json:"next_cursor,omitempty"`
}

// OperatorAction is one audited operator action (a saga_audit row written
// for an operator).
type OperatorAction struct {
	AuditID     int64     `json:"audit_id"`
	At          time.Time `json:"at"`
	Operator    string    `json:"operator"`
	Action      string    `json:"action"`
	SagaID      string    `json:"saga_id"`
	SagaType    string    `json:"saga_type"`
	BusinessKey string    `json:"business_key,omitempty"`
	From        string    `json:"from"`
	To          string    `json:"to"`
	MessageID   string    `json:"message_id,omitempty"`
	// Note holds the reason (and what the action did).
	Note    string `json:"note,omitempty"`
	Version int64  `json:"version"`
}
