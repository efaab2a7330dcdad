package model

import (
	"cmp"
	"fmt"
	"slices"
)

// Pos is a source position: a .proto file path and 1-based line and column.
type Pos struct {
	File      string
	Line, Col int
}

// String returns "file:line:col".
func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Diagnostic is one design-review finding.
type Diagnostic struct {
	Pos Pos
	// Rule is the rule id (see docs/design-review.md).
	Rule    string
	Message string
	// Hint says how to fix it; may be empty.
	Hint string
	// Warning findings do not fail generation unless promoted
	// (plugin parameter warnings=error).
	Warning bool
}

// Error formats the diagnostic as "file:line:col: rule-id: message (hint: ...)";
// warnings carry "warning: " before the message.
func (d Diagnostic) Error() string {
	msg := d.Message
	if d.Warning {
		msg = "warning: " + msg
	}
	s := fmt.Sprintf("%s: %s: %s", d.Pos, d.Rule, msg)
	if d.Hint != "" {
		s += " (hint: " + d.Hint + ")"
	}
	return s
}

func sortDiagnostics(ds []Diagnostic) {
	slices.SortStableFunc(ds, func(a, b Diagnostic) int {
		return cmp.Or(
			cmp.Compare(a.Pos.File, b.Pos.File),
			cmp.Compare(a.Pos.Line, b.Pos.Line),
			cmp.Compare(a.Pos.Col, b.Pos.Col),
			cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(a.Message, b.Message),
		)
	})
}

// path appends elements to a copy of base.
func path(base []int32, elems ...int32) []int32 {
	out := make([]int32, 0, len(base)+len(elems))
	out = append(out, base...)
	return append(out, elems...)
}
