package app_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
)

func TestParseRoles(t *testing.T) {
	t.Parallel()
	roles, err := app.ParseRoles("relay, orchestrator,relay")
	require.NoError(t, err)
	require.Equal(t, []app.Role{app.RoleRelay, app.RoleOrchestrator}, roles)
	roles, err = app.ParseRoles("participants")
	require.NoError(t, err)
	require.Equal(t, app.ParticipantRoles(), roles)
	roles, err = app.ParseRoles("all")
	require.NoError(t, err)
	require.Equal(t, app.AllRoles(), roles)
	_, err = app.ParseRoles("relay,cashier")
	require.ErrorContains(t, err, `unknown role "cashier"`)
	_, err = app.ParseRoles(" , ")
	require.Error(t, err)
}

func TestCrashPointsFireOnTheArmedPassage(t *testing.T) {
	t.Parallel()
	arm, err := app.ParseCrashArm("after-commit-before-ack:3, mid-compensation")
	require.NoError(t, err)
	require.Equal(t, map[app.CrashPoint]int{app.CrashAfterCommit: 3, app.CrashMidCompensation: 1}, arm)
	for _, bad := range []string{"nowhere:1", "after-commit-before-ack:0", "after-commit-before-ack:x"} {
		_, err := app.ParseCrashArm(bad)
		require.Error(t, err, bad)
	}
	var fired []app.CrashPoint
	c := app.NewCrashes(func(p app.CrashPoint) { fired = append(fired, p) }, arm)
	require.True(t, c.Armed())
	for range 5 {
		app.PassCrashPoint(c, app.CrashAfterCommit)
	}
	app.PassCrashPoint(c, app.CrashMidCompensation)
	app.PassCrashPoint(c, app.CrashMidCompensation)
	require.Equal(t, []app.CrashPoint{app.CrashAfterCommit, app.CrashMidCompensation}, fired, "each fires once, on its passage")
	require.False(t, c.Armed())
	app.PassCrashPoint(nil, app.CrashAfterCommit) // no crash points: a no-op
}
