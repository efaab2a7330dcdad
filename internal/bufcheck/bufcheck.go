// Package bufcheck is buf-plugin-saga: a buf check plugin (buf.build/go/bufplugin)
// that brings the saga contract's rules to `buf lint` and `buf breaking`.
//
// Lint rules are the design review of protoc-gen-saga itself: the plugin
// reads buf's image into the code generator request protoc-gen-saga would
// receive (`strategy: all`), runs the same review (package model) and
// reports each finding under the rule SAGA_<RULE_ID> at the same position,
// with the same message and hint. Nothing is reimplemented: a rule added to
// the review is a lint rule here. Review errors are in category SAGA;
// review warnings, which do not fail generation, are in SAGA_WARNINGS and
// not run unless listed.
//
// Breaking rules compare the sagas and messages of the contract with those
// of the against contract, both read by the same model, and report the
// changes plain `buf breaking` cannot see because they live in option
// values: a renamed or removed saga or step, a changed business or
// idempotency key, step order, role, routing, late-reply policy, and the
// other changes that strand or mislead sagas in flight. Each finding says
// what happens to instances in flight. They are in category SAGA_BREAKING.
package bufcheck

import (
	"context"
	"fmt"
	"strings"

	"buf.build/go/bufplugin/check"
	"buf.build/go/bufplugin/info"

	"github.com/protosaga/saga/internal/gen/model"
)

// Category ids.
const (
	// CategoryLint holds the design review's error rules.
	CategoryLint = "SAGA"
	// CategoryLintWarnings holds the design review's warning rules; they are
	// not run by default (generation does not fail on them either).
	CategoryLintWarnings = "SAGA_WARNINGS"
	// CategoryBreaking holds the saga breaking rules.
	CategoryBreaking = "SAGA_BREAKING"
)

// LintRuleID returns the buf rule id of a design-review rule:
// "command-idempotency" → "SAGA_COMMAND_IDEMPOTENCY".
func LintRuleID(reviewRule string) string {
	return "SAGA_" + strings.ToUpper(strings.ReplaceAll(reviewRule, "-", "_"))
}

// lintPurposes says what each design-review rule checks, for `buf config
// ls-lint-rules`; docs/design-review.md gives the rationale.
var lintPurposes = map[string]string{
	"message-kind":              "Checks that every annotated message says whether it is a command, an event or a reply.",
	"command-idempotency":       "Checks that every command names the fields its business idempotency key is built from.",
	"reply-correlation":         "Checks that every reply names its correlation field.",
	"field-path":                "Checks that key, correlation, sensitive and business-key fields name existing fields of a usable type.",
	"routing-key":               "Checks routing keys, exchanges and service names, and that no two messages share an exchange and routing key.",
	"schema-version":            "Checks that schema versions are positive.",
	"option-misuse":             "Checks that owner is set on commands only and answers on replies only.",
	"command-consumer":          "Checks that every command has exactly one consumer and that step commands have an owner.",
	"reply-unused":              "Warns about replies no saga step waits for.",
	"command-unused":            "Warns about owned commands no saga step sends and no reply answers.",
	"event-unused":              "Warns about events no saga consumes and no service subscribes to, which reach no generated queue.",
	"expiry-retry":              "Warns about messages that expire before their queue's retry tiers end.",
	"retry-policy":              "Checks declared retry policies: valid tiers and attempts, one policy per queue.",
	"subscriber-service":        "Checks that an event's subscribers are valid service names, each listed once.",
	"reply-consumer":            "Checks that a reply is awaited by one saga only.",
	"reply-answers":             "Checks that a reply declaring the command it answers is listed under the step that sends that command.",
	"reply-package":             "Checks that a reply lives in the Go package of the command it answers.",
	"owner-package":             "Checks that a service owns commands in one Go package only.",
	"saga-reference":            "Checks that every message a saga names exists, is annotated and has the right kind.",
	"saga-name":                 "Checks that saga names are CamelCase identifiers.",
	"saga-start":                "Checks that every saga declares the command or event that starts it, and that a start command has no owner.",
	"saga-business-key":         "Checks that every saga declares its unique business key.",
	"saga-steps":                "Checks that every saga has at least one step.",
	"saga-ambiguous":            "Checks that every message plays one part in a saga.",
	"duration":                  "Checks that timeouts and deadlines are positive Go durations.",
	"step-name":                 "Checks that step names are CamelCase and unique within their saga.",
	"step-role":                 "Checks that every step declares its role.",
	"step-replies":              "Checks that every step lists at least one success reply or event.",
	"step-external":             "Checks that a step either sends a command or waits for an external event.",
	"step-compensation":         "Checks that compensatable steps, and only they, declare a compensation.",
	"step-timeout":              "Checks that every step has a timeout and that retriable steps do not compensate on timeout.",
	"step-late-reply":           "Checks that every step declares what a late reply does.",
	"pivot-late-reply":          "Warns about a pivot that compensates on timeout without sending late replies to manual review.",
	"retry-budget":              "Checks that retry budgets fit the saga deadline and can retry at all.",
	"saga-deadline":             "Checks that the saga deadline is no shorter than its longest forward path, every step waiting out its whole budget.",
	"retry-tiers":               "Warns about a pivot that compensates on a timeout no longer than its command may wait in the retry tiers.",
	"late-reply-inert":          "Checks that a late-reply policy can take effect with the step's role and timeout action (APPLY_IF_WAITING needs a step that resends on timeout).",
	"compensation-owner":        "Warns about a step whose command and compensation are owned by different services.",
	"compensatable-after-pivot": "Checks that no compensatable step follows the pivot or a retriable step.",
	"check-after-pivot":         "Checks that no check step follows the pivot or a retriable step.",
	"step-conditional":          "Checks that the pivot is not conditional and that not every step is conditional.",
	"group-reference":           "Checks that every parallel group a step names is declared once, under a CamelCase name no step has.",
	"group-members":             "Checks that a parallel group has at least two consecutive members and does not contain the pivot.",
	"group-timeout":             "Checks that a parallel group declares a timeout no shorter than any member's wait.",
	"group-execution":           "Checks that a parallel group's members can run together: none external or conditional, all before the point of no return or all after it.",
	"non-retriable-after-pivot": "Checks that every step after the pivot is retriable.",
	"cancel-reference":          "Checks that a saga's cancel names an annotated command or event.",
	"cancel-correlation":        "Checks that a cancel message declares a correlation field.",
	"cancel-ambiguous":          "Checks that a cancel message plays no other part in its saga.",
	"cancel-fields":             "Checks that a cancel names the string fields saying who asked and why.",
	"callback-outcomes":         "Checks that a saga's callbacks name outcomes it can reach, each once.",
	"callback-target":           "Checks that a saga's callbacks name one target: a string field of the saga data holding a URL or a client id.",
	"saga-replies":              "Checks that a child saga names a reply per outcome, each correlating on a field of its data.",
	"reply-fields":              "Warns about a child saga's reply field that its saga data lacks or holds with another type: it always goes out empty.",
	"child-reference":           "Checks that a child step names a saga of the request that declares its replies and starts from a command.",
	"child-replies":             "Checks that a child step sends the child's start message and waits for the child's outcome replies.",
	"child-compensation":        "Checks that a compensatable child step cancels the child and waits for its cancelled reply, and that a check step starts no child with effects.",
	"child-pivot":               "Checks that a step starting a child with a pivot or retriable steps is the pivot or a retriable step.",
	"child-cycle":               "Checks that no saga is its own ancestor through child steps.",
	"name-collision":            "Checks that generated Go identifiers collide neither with each other nor with protoc-gen-go's.",
	"name-length":               "Checks that generated table, queue, exchange and routing key names fit PostgreSQL and RabbitMQ.",
	"go-package":                "Checks that every file has a Go import path.",
	"saga-definition":           "Checks that the runtime compiles every saga definition.",
}

// Spec returns the plugin's specification: one lint rule per design-review
// rule (model.Rules) and the saga breaking rules.
func Spec() *check.Spec {
	spec := &check.Spec{
		Categories: []*check.CategorySpec{
			{ID: CategoryLint, Purpose: "Checks saga contracts with the design review protoc-gen-saga runs before generating."},
			{ID: CategoryLintWarnings, Purpose: "Reports the design review's warnings, which do not fail generation."},
			{ID: CategoryBreaking, Purpose: "Checks that a contract change does not strand or mislead sagas in flight."},
		},
		Info: &info.Spec{
			Documentation: "Saga contract rules for buf lint and buf breaking: the protoc-gen-saga design review, " +
				"and the changes that break sagas in flight (docs/design-review.md).",
		},
		Before: before,
	}
	for _, r := range model.Rules {
		category := CategoryLint
		if r.Warning {
			category = CategoryLintWarnings
		}
		purpose := lintPurposes[r.ID]
		if purpose == "" {
			purpose = fmt.Sprintf("Reports the design review's %s findings (docs/design-review.md).", r.ID)
		}
		spec.Rules = append(spec.Rules, &check.RuleSpec{
			ID:          LintRuleID(r.ID),
			CategoryIDs: []string{category},
			Default:     !r.Warning,
			Purpose:     purpose,
			Type:        check.RuleTypeLint,
			Handler:     lintHandler(r.ID),
		})
	}
	for _, r := range breakingRules {
		spec.Rules = append(spec.Rules, &check.RuleSpec{
			ID:          r.id,
			CategoryIDs: []string{CategoryBreaking},
			Default:     true,
			Purpose:     r.purpose,
			Type:        check.RuleTypeBreaking,
			Handler:     breakingHandler(r.id),
		})
	}
	return spec
}

// lintHandler reports the findings of the design-review rule reviewRule.
func lintHandler(reviewRule string) check.RuleHandler {
	return check.RuleHandlerFunc(func(ctx context.Context, rw check.ResponseWriter, req check.Request) error {
		c, findings, err := sessionFor(ctx, req).review()
		if err != nil {
			return err
		}
		for _, d := range findings {
			if d.Rule != reviewRule {
				continue
			}
			opts := []check.AddAnnotationOption{check.WithMessage(lintMessage(d))}
			if loc := c.location(d.Pos); loc != nil {
				opts = append(opts, loc)
			}
			rw.AddAnnotation(opts...)
		}
		return nil
	})
}

// lintMessage is a finding's message and hint as protoc-gen-saga prints
// them (buf prints the position and the plugin's name around it).
func lintMessage(d model.Diagnostic) string {
	if d.Hint == "" {
		return d.Message
	}
	return d.Message + " (hint: " + d.Hint + ")"
}
