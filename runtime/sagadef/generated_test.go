package sagadef_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

// TestCompileGenerated: a definition carrying the table Compile computes is
// accepted; one whose printed table differs (a row missing, or a state
// renamed — generated against another runtime) is refused with ErrStaleTable.
func TestCompileGenerated(t *testing.T) {
	t.Parallel()
	printed := compiled(t, placeOrder())
	generated := func() *sagadef.Definition {
		d := placeOrder()
		d.States = slices.Clone(printed.States)
		d.Transitions = slices.Clone(printed.Transitions)
		return d
	}

	require.NoError(t, generated().CompileGenerated())

	missingRow := generated()
	missingRow.Transitions = missingRow.Transitions[1:]
	require.ErrorIs(t, missingRow.CompileGenerated(), sagadef.ErrStaleTable)

	renamed := generated()
	renamed.States[0].Name += "_OLD"
	err := renamed.CompileGenerated()
	require.ErrorIs(t, err, sagadef.ErrStaleTable)
	require.ErrorContains(t, err, renamed.Name)

	invalid := generated()
	invalid.Steps = nil
	require.ErrorIs(t, invalid.CompileGenerated(), sagadef.ErrInvalidDefinition, "an invalid definition fails as such, before the table check")
}
