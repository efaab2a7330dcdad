// Package signature signs callback deliveries and verifies them on the
// receiving side. It depends on the standard library only, so a receiver
// imports it without the runtime's database or broker code.
//
// # Scheme
//
// A delivery carries three headers:
//
//	Saga-Callback-Id:        the callback's id, stable across retries (dedupe by it)
//	Saga-Callback-Timestamp: Unix seconds when this attempt was signed
//	Saga-Callback-Signature: v1=KEYID:HEX[,v1=KEYID:HEX]
//
// Each v1 entry is HEX = hex(HMAC-SHA256(secret, TIMESTAMP + "." + BODY)),
// signed with the secret whose id is KEYID. The sender signs with every key
// it holds (at most two: the current one and, during a rotation, the one it
// replaces), so a receiver that knows either secret verifies the delivery.
//
// # Receivers
//
// [Verifier.Verify] checks the timestamp against a replay window (default
// five minutes either way) and accepts the request when any entry whose key
// id it knows matches. A request older than the window is refused even when
// its signature is valid: a captured request cannot be replayed later. Within
// the window, the callback id deduplicates: the sender retries a delivery it
// could not confirm with the same id and body, so a receiver stores the ids
// it processed (for at least the window plus the sender's retry budget) and
// acknowledges a repeated id without a second effect.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of a signed delivery.
const (
	HeaderID        = "Saga-Callback-Id"
	HeaderTimestamp = "Saga-Callback-Timestamp"
	HeaderSignature = "Saga-Callback-Signature"
)

// DefaultWindow is how far a delivery's timestamp may lie from the
// receiver's clock, either way, by default.
const DefaultWindow = 5 * time.Minute

// Key is one signing secret and the id receivers know it by. Key ids are
// printable ASCII without ',', ':', '=' or spaces.
type Key struct {
	ID     string
	Secret []byte
}

// Errors matched (errors.Is) by the errors Verify returns.
var (
	ErrMissing   = errors.New("callback signature headers missing")
	ErrMalformed = errors.New("callback signature malformed")
	ErrExpired   = errors.New("callback timestamp outside the replay window")
	ErrNoMatch   = errors.New("no callback signature matches a known key")
)

// ValidateKeys reports whether keys can sign: one or two keys, each with a
// well-formed, distinct id and a secret of at least 16 bytes.
func ValidateKeys(keys []Key) error {
	if len(keys) == 0 || len(keys) > 2 {
		return fmt.Errorf("signing keys: want 1 or 2 (current, and the previous during a rotation), got %d", len(keys))
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if !validKeyID(k.ID) {
			return fmt.Errorf("signing key id %q: want 1-64 printable ASCII characters without ',', ':', '=' or spaces", k.ID)
		}
		if seen[k.ID] {
			return fmt.Errorf("signing key id %q given twice", k.ID)
		}
		seen[k.ID] = true
		if len(k.Secret) < 16 {
			return fmt.Errorf("signing key %q: secret has %d bytes, want at least 16", k.ID, len(k.Secret))
		}
	}
	return nil
}

func validKeyID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c <= ' ' || c > '~' || c == ',' || c == ':' || c == '=' {
			return false
		}
	}
	return true
}

// Sign returns the Saga-Callback-Signature value for body signed at ts with
// each of keys.
func Sign(keys []Key, ts time.Time, body []byte) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, "v1="+k.ID+":"+hex.EncodeToString(mac(k.Secret, t, body)))
	}
	return strings.Join(parts, ",")
}

// SetHeaders signs body at ts and sets the three delivery headers on h.
func SetHeaders(h http.Header, id string, keys []Key, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, Sign(keys, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verifier checks signed deliveries. Keys holds every secret the receiver
// accepts (during a rotation, the old and the new one).
type Verifier struct {
	Keys []Key
	// Window bounds |now - timestamp|. Default: DefaultWindow.
	Window time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Verify checks one delivery's headers against its raw body. It returns the
// callback id to deduplicate by.
func (v Verifier) Verify(h http.Header, body []byte) (id string, err error) {
	id, ts, sig := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sig == "" {
		return "", ErrMissing
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("callback %s: timestamp %q: %w", id, ts, ErrMalformed)
	}
	now, window := time.Now, v.Window
	if v.Now != nil {
		now = v.Now
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if d := now().Sub(time.Unix(secs, 0)); d > window || d < -window {
		return "", fmt.Errorf("callback %s: signed %s ago, window %s: %w", id, d.Round(time.Second), window, ErrExpired)
	}
	for _, part := range strings.Split(sig, ",") {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || scheme != "v1" {
			continue // an unknown scheme is skipped, so a sender can add one
		}
		kid, hexsig, ok := strings.Cut(rest, ":")
		if !ok {
			return "", fmt.Errorf("callback %s: signature entry %q: %w", id, part, ErrMalformed)
		}
		got, err := hex.DecodeString(hexsig)
		if err != nil {
			return "", fmt.Errorf("callback %s: signature entry for key %q: %w", id, kid, ErrMalformed)
		}
		for _, k := range v.Keys {
			if k.ID == kid && hmac.Equal(got, mac(k.Secret, ts, body)) {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("callback %s: %w", id, ErrNoMatch)
}

// VerifyRequest reads r's body (at most maxBody bytes; 0 means 1 MiB) and
// verifies it. It returns the id and the body for the handler to decode.
func (v Verifier) VerifyRequest(r *http.Request, maxBody int64) (id string, body []byte, err error) {
	if maxBody <= 0 {
		maxBody = 1 << 20
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return "", nil, fmt.Errorf("read callback body: %w", err)
	}
	if int64(len(body)) > maxBody {
		return "", nil, fmt.Errorf("callback body exceeds %d bytes: %w", maxBody, ErrMalformed)
	}
	id, err = v.Verify(r.Header, body)
	return id, body, err
}

// ParseKeys reads keys from "ID:SECRET[,ID:SECRET]" (the form of the
// SAGA_CALLBACK_KEYS variable), the current key first, and validates them.
func ParseKeys(s string) ([]Key, error) {
	var keys []Key
	for _, part := range strings.Split(s, ",") {
		id, secret, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("signing key %q: want ID:SECRET", id)
		}
		keys = append(keys, Key{ID: id, Secret: []byte(secret)})
	}
	if err := ValidateKeys(keys); err != nil {
		return nil, err
	}
	return keys, nil
}
