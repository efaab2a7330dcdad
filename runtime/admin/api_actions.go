package admin

import "time"

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
