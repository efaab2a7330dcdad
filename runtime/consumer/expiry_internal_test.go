package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
)

func TestExpired(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	env := &message.Envelope{MessageID: "m-1", MessageType: "test.Reminder"}
	require.NoError(t, expired(env, at), "no expiry header: never expires")

	message.SetExpiry(env, at)
	require.NoError(t, expired(env, at.Add(-time.Millisecond)))
	err := expired(env, at)
	require.ErrorContains(t, err, "expired: message m-1 (test.Reminder) was to be received by 2030-01-01T12:00:00Z")

	env.Headers[message.HeaderExpiresAt] = "tomorrow"
	require.ErrorContains(t, expired(env, at), "expired: message m-1 (test.Reminder): unreadable x-saga-expires-at header")
}
