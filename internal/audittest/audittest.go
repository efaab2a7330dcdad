// Package audittest reads a saga's audit trail for integration tests: its
// path as steps, and a rendering for failure messages.
package audittest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/protosaga/saga/runtime/saga"
)

// Step is one audit row of a saga, reduced to what its path is made of:
// the states, the trigger's short name and the class.
type Step struct{ From, To, Trigger, Class string }

// Short returns the last element of a dotted full name ("InventoryReserved"
// for "shop.inventory.v1.InventoryReserved").
func Short(name string) string { return name[strings.LastIndex(name, ".")+1:] }

// Audit returns the saga's audit trail, oldest first.
func Audit(t testing.TB, e *saga.Engine, sagaID string) []saga.AuditRecord {
	t.Helper()
	recs, err := e.History(context.Background(), sagaID)
	if err != nil {
		t.Fatalf("audittest: audit of saga %s: %v", sagaID, err)
	}
	return recs
}

// Path returns the saga's audit trail as Steps.
func Path(t testing.TB, e *saga.Engine, sagaID string) []Step {
	t.Helper()
	var out []Step
	for _, r := range Audit(t, e, sagaID) {
		out = append(out, Step{r.From, r.To, Short(r.Trigger), r.Class})
	}
	return out
}

// AuditText renders the saga's audit trail for a failure message.
func AuditText(t testing.TB, e *saga.Engine, sagaID string) string {
	t.Helper()
	var sb strings.Builder
	for _, r := range Audit(t, e, sagaID) {
		fmt.Fprintf(&sb, "  %s -> %s on %s (%s) msg=%s cause=%s operator=%q note=%q\n",
			r.From, r.To, Short(r.Trigger), r.Class, r.MessageID, r.CausationID, r.Operator, r.Note)
	}
	return sb.String()
}
