package saga

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

func TestAuditNote(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, reason string
		res          sagadef.Result
		want         string
	}{
		{"no reason", "", sagadef.Result{Note: "step A timed out"}, "step A timed out"},
		{"reason the note says", "carrier back", sagadef.Result{Note: "operator.retry by ops: carrier back", ReasonNoted: true},
			"operator.retry by ops: carrier back"},
		{"reason whose words occur in the note", "timed out", sagadef.Result{Note: "step A timed out"},
			"reason: timed out; step A timed out"},
		{"reason and no note", "why", sagadef.Result{}, "reason: why"},
	} {
		t.Run(c.name, func(t *testing.T) { require.Equal(t, c.want, note(c.reason, c.res)) })
	}
}
