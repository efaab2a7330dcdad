package sagadef_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

func TestCallbackDeclarationIsValidated(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		cb   sagadef.Callback
		want string
	}{
		"no target":        {sagadef.Callback{States: []string{sagadef.StateCompleted}}, "exactly one of URLField and ClientField"},
		"two targets":      {sagadef.Callback{States: []string{sagadef.StateCompleted}, URLField: "a", ClientField: "b"}, "exactly one of URLField and ClientField"},
		"step state":       {sagadef.Callback{States: []string{"RESERVE"}, URLField: "a"}, `state "RESERVE" cannot be delivered`},
		"twice":            {sagadef.Callback{States: []string{sagadef.StateFailed, sagadef.StateFailed}, URLField: "a"}, `state "FAILED" listed twice`},
		"target, no state": {sagadef.Callback{URLField: "a"}, "no states to deliver"},
	} {
		def := placeOrder()
		def.Callback = c.cb
		err := def.Compile()
		require.ErrorContains(t, err, c.want, name)
	}
	def := placeOrder()
	def.Callback = sagadef.Callback{States: []string{sagadef.StateCompleted, sagadef.StateManualReview}, ClientField: "client"}
	require.NoError(t, def.Compile())
	require.True(t, def.Callback.Delivers(sagadef.StateManualReview))
	require.False(t, def.Callback.Delivers(sagadef.StateFailed))
}
