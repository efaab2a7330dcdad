package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
)

// TestStepTimeoutsOverrideTheContract: a deployment shortens one step's
// timeout; the armed timeout_at and the scanner follow the override, other
// steps keep the contract's, and the shared definition is left untouched.
func TestStepTimeoutsOverrideTheContract(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	eng := b.newEngine(t, func(c *saga.Config) {
		c.StepTimeouts = map[string]time.Duration{"ReserveInventory": 2 * time.Second}
	})
	ctx := context.Background()

	id, created, err := eng.Start(ctx, msg(msgPlaceOrder, "order-short"), message.Meta{MessageID: newID()})
	require.NoError(t, err)
	require.True(t, created)
	st, err := eng.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, baseTime.Add(2*time.Second), st.TimeoutAt.UTC(), "the override arms the timeout")

	b.clock.Advance(3 * time.Second)
	fired, err := eng.FireTimeouts(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, fired, "the scanner fires after the overridden timeout, long before the contract's")

	require.Equal(t, stepTimeout, b.def.Steps[0].Timeout, "the caller's definition is not modified")
	require.Equal(t, 2*time.Second, eng.Definition().Steps[0].Timeout)
	require.Equal(t, stepTimeout, eng.Definition().Steps[1].Timeout, "other steps keep the contract's timeout")

	for name, d := range map[string]time.Duration{"NoSuchStep": time.Second, "ReserveInventory": 0} {
		_, err := saga.New(saga.Config{
			Pool: b.pool, Definition: b.def, Hooks: hooks{}, StepTimeouts: map[string]time.Duration{name: d},
		})
		require.Error(t, err, name)
		require.ErrorContains(t, err, name)
	}
}
