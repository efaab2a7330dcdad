package sagadef

import "testing"

// LateReplyTables returns the late-reply tables of docs/options.md, derived
// from Apply (see late_table_test.go).
func LateReplyTables(t *testing.T) string {
	t.Helper()
	return deriveLateTables(t).markdown()
}
