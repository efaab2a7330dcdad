package message_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagatest"
)

// TestTimeToBeReceived: New stamps the expiry of a type with a time to be
// received, counted from OccurredAt, and it travels in the AMQP headers;
// a type without one carries none.
func TestTimeToBeReceived(t *testing.T) {
	t.Parallel()
	sent := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	typ := sagatest.NewType("test.Reminder", message.KindEvent)
	typ.TimeToBeReceived = 90 * time.Second
	env, err := message.New(sagatest.NewMessage(typ, "r-1"), message.Meta{OccurredAt: sent})
	require.NoError(t, err)
	at, ok, err := message.ExpiresAt(&env)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, sent.Add(90*time.Second), at)
	require.Equal(t, "2030-01-01T12:01:30Z", env.Publishing().Headers[message.HeaderExpiresAt])

	plain, err := message.New(sagatest.NewMessage(sagatest.NewType("test.Plain", message.KindEvent), "p-1"), message.Meta{OccurredAt: sent})
	require.NoError(t, err)
	_, ok, err = message.ExpiresAt(&plain)
	require.NoError(t, err)
	require.False(t, ok)
}
