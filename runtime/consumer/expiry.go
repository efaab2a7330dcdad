package consumer

import (
	"fmt"
	"time"

	"github.com/protosaga/saga/runtime/message"
)

// expired returns the error that parks a delivery whose expiry
// (message.HeaderExpiresAt, set from its type's TimeToBeReceived) is at or
// before now, the time the consumer received it; nil when it carries none
// or has not expired. The error text starts with "expired", the reason the
// parked message shows. A header that is not a time is refused the same
// way: the sender is broken, and a retry reads the same header.
func expired(env *message.Envelope, now time.Time) error {
	at, ok, err := message.ExpiresAt(env)
	switch {
	case err != nil:
		return fmt.Errorf("expired: message %s (%s): unreadable %s header: %w", env.MessageID, env.MessageType, message.HeaderExpiresAt, err)
	case !ok || now.Before(at):
		return nil
	}
	return fmt.Errorf("expired: message %s (%s) was to be received by %s and was received at %s",
		env.MessageID, env.MessageType, at.Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
}
