package sagadef_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

var update = flag.Bool("update", false, "rewrite the derived late-reply tables in docs/options.md")

// The late-reply tables sit in docs/options.md between these lines.
const (
	lateDocFile  = "../../docs/options.md"
	lateDocBegin = "<!-- The tables below are derived from the runtime: go test ./runtime/sagadef -run TestLateReplyTableInDocs -update -->\n"
	lateDocEnd   = "<!-- End of the derived tables. -->\n"
)

// TestLateReplyTableInDocs derives the late-reply tables from the state
// machine (exploring every step shape under every policy) and compares
// them with the ones docs/options.md prints; -update rewrites them there.
func TestLateReplyTableInDocs(t *testing.T) {
	t.Parallel()
	got := sagadef.LateReplyTables(t)
	raw, err := os.ReadFile(lateDocFile)
	require.NoError(t, err)
	doc := string(raw)
	begin, end := strings.Index(doc, lateDocBegin), strings.Index(doc, lateDocEnd)
	require.True(t, begin >= 0 && end > begin, "%s lacks the markers of the late-reply tables", lateDocFile)
	begin += len(lateDocBegin)
	if *update {
		require.NoError(t, os.WriteFile(lateDocFile, []byte(doc[:begin]+got+doc[end:]), 0o644))
		return
	}
	require.Equal(t, got, doc[begin:end],
		"the late-reply tables in %s are not what the runtime does; if the change is intended, rerun with -update", lateDocFile)
}
