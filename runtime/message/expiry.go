package message

import (
	"maps"
	"time"
)

// HeaderExpiresAt carries the time (RFC 3339, UTC) after which a message is
// no longer to be handled: consumers park it with the reason "expired"
// instead of running their handler. [New] sets it for a type with a
// TimeToBeReceived (counted from OccurredAt); a scheduled message counts
// it from the time it is due.
const HeaderExpiresAt = "x-saga-expires-at"

// SetExpiry sets e's HeaderExpiresAt header to at. e's Headers map is
// copied first, so an envelope sharing it is not changed.
func SetExpiry(e *Envelope, at time.Time) {
	h := maps.Clone(e.Headers)
	if h == nil {
		h = map[string]any{}
	}
	h[HeaderExpiresAt] = at.UTC().Format(time.RFC3339Nano)
	e.Headers = h
}

// ExpiresAt returns the expiry e carries in HeaderExpiresAt; ok is false
// when it carries none, err non-nil when the header is not a time.
func ExpiresAt(e *Envelope) (at time.Time, ok bool, err error) {
	return HeaderTime(e.Headers, HeaderExpiresAt)
}
