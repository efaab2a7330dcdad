package model

// Rule describes one design-review rule; docs/design-review.md explains
// each and testdata/review holds a failing contract for each.
type Rule struct {
	ID string
	// Warning rules do not fail generation unless warnings=error.
	Warning bool
	// Defensive rules guard against states the other rules already
	// prevent; they have no failing contract of their own.
	Defensive bool
}

// Rules lists every rule id the review can report.
var Rules = []Rule{
	{ID: "message-kind"},
	{ID: "command-idempotency"},
	{ID: "reply-correlation"},
	{ID: "field-path"},
	{ID: "routing-key"},
	{ID: "schema-version"},
	{ID: "option-misuse"},
	{ID: "command-consumer"},
	{ID: "reply-unused", Warning: true},
	{ID: "command-unused", Warning: true},
	{ID: "event-unused", Warning: true},
	{ID: "subscriber-service"},
	{ID: "reply-consumer"},
	{ID: "reply-answers"},
	{ID: "reply-package"},
	{ID: "owner-package"},
	{ID: "saga-reference"},
	{ID: "saga-name"},
	{ID: "saga-start"},
	{ID: "saga-business-key"},
	{ID: "saga-steps"},
	{ID: "saga-ambiguous"},
	{ID: "duration"},
	{ID: "step-name"},
	{ID: "step-role"},
	{ID: "step-replies"},
	{ID: "step-external"},
	{ID: "step-compensation"},
	{ID: "step-timeout"},
	{ID: "step-late-reply"},
	{ID: "pivot-late-reply", Warning: true},
	{ID: "late-reply-inert"},
	{ID: "retry-budget"},
	{ID: "saga-deadline"},
	{ID: "retry-tiers", Warning: true},
	{ID: "retry-policy"},
	{ID: "expiry-retry", Warning: true},
	{ID: "compensation-owner", Warning: true},
	{ID: "compensatable-after-pivot"},
	{ID: "check-after-pivot"},
	{ID: "step-conditional"},
	{ID: "group-reference"},
	{ID: "group-members"},
	{ID: "group-timeout"},
	{ID: "group-execution"},
	{ID: "non-retriable-after-pivot"},
	{ID: "cancel-reference"},
	{ID: "cancel-correlation"},
	{ID: "cancel-ambiguous"},
	{ID: "cancel-fields"},
	{ID: "callback-outcomes"},
	{ID: "callback-target"},
	{ID: "saga-replies"},
	{ID: "reply-fields", Warning: true},
	{ID: "child-reference"},
	{ID: "child-replies"},
	{ID: "child-compensation"},
	{ID: "child-pivot"},
	{ID: "child-cycle"},
	{ID: "name-collision"},
	{ID: "name-length"},
	{ID: "go-package"},
	{ID: "saga-definition", Defensive: true},
}
