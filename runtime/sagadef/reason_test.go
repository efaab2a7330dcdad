package sagadef_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// TestReasonNoted checks that a result says whether its note already says
// the trigger's reason, so the engine adds the reason exactly when the note
// does not say it — also when the reason's words happen to occur in the note.
func TestReasonNoted(t *testing.T) {
	t.Parallel()
	t.Run("an operator's action says its reason", func(t *testing.T) {
		h := sagatest.New(t, compiled(t, placeOrder()), hooks())
		toShipping(h)
		res := h.OperatorCompensate("carrier gone")
		require.True(t, res.ReasonNoted)
		require.Contains(t, res.Note, "carrier gone")
	})
	t.Run("a stuck saga's review says its reason", func(t *testing.T) {
		h := sagatest.New(t, compiled(t, placeOrder()), hooks())
		h.Start(msg(pPlaceOrder))
		res, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerStuck, Reason: "hook kept failing"})
		require.NoError(t, err)
		require.True(t, res.ReasonNoted)
		require.Contains(t, res.Note, "hook kept failing")
	})
	t.Run("a timeout's note does not say a reason, even one it contains", func(t *testing.T) {
		h := sagatest.New(t, compiled(t, placeOrder()), hooks())
		h.Start(msg(pPlaceOrder))
		h.Advance(time.Hour)
		res, err := h.TryApply(sagadef.Trigger{Kind: sagadef.TriggerTimeout, Reason: "timed out"})
		require.NoError(t, err)
		require.Contains(t, res.Note, "timed out", "the words occur in the note")
		require.False(t, res.ReasonNoted, "but the note does not say the trigger's reason")
	})
}
