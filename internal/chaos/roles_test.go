package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseRoles(t *testing.T) {
	t.Parallel()
	roles, err := ParseRoles("relay, orchestrator,relay")
	require.NoError(t, err)
	require.Equal(t, []Role{RoleRelay, RoleOrchestrator}, roles)
	roles, err = ParseRoles("participants")
	require.NoError(t, err)
	require.Equal(t, ParticipantRoles(), roles)
	roles, err = ParseRoles("all")
	require.NoError(t, err)
	require.Equal(t, AllRoles(), roles)
	_, err = ParseRoles("relay,cashier")
	require.ErrorContains(t, err, `unknown role "cashier"`)
	_, err = ParseRoles(" , ")
	require.Error(t, err)
}

func TestCrashPointsFireOnTheArmedPassage(t *testing.T) {
	t.Parallel()
	arm, err := ParseCrashArm("after-commit-before-ack:3, mid-compensation")
	require.NoError(t, err)
	require.Equal(t, map[CrashPoint]int{CrashAfterCommit: 3, CrashMidCompensation: 1}, arm)
	for _, bad := range []string{"nowhere:1", "after-commit-before-ack:0", "after-commit-before-ack:x"} {
		_, err := ParseCrashArm(bad)
		require.Error(t, err, bad)
	}
	var fired []CrashPoint
	c := NewCrashes(func(p CrashPoint) { fired = append(fired, p) }, arm)
	require.True(t, c.Armed())
	for range 5 {
		c.pass(CrashAfterCommit)
	}
	c.pass(CrashMidCompensation)
	c.pass(CrashMidCompensation)
	require.Equal(t, []CrashPoint{CrashAfterCommit, CrashMidCompensation}, fired, "each fires once, on its passage")
	require.False(t, c.Armed())
	var none *Crashes
	none.pass(CrashAfterCommit) // no crash points: a no-op
}
