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
	// Stuck is set when the saga is stuck by saga.StuckRule (the rule
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
