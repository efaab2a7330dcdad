package signature_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/callback/signature"
)

var (
	oldKey = signature.Key{ID: "2026-11", Secret: []byte("old-secret-0123456789")}
	newKey = signature.Key{ID: "2026-12", Secret: []byte("new-secret-0123456789")}
	now    = time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	body   = []byte(`{"callbackId":"0193a6c0-0000-7000-8000-000000000001","event":"saga.completed"}`)
)

func signed(keys ...signature.Key) http.Header {
	h := http.Header{}
	signature.SetHeaders(h, "cb-1", keys, now, body)
	return h
}

func verifier(keys ...signature.Key) signature.Verifier {
	return signature.Verifier{Keys: keys, Now: func() time.Time { return now.Add(30 * time.Second) }}
}

func TestVerifyAcceptsEitherKeyDuringRotation(t *testing.T) {
	t.Parallel()
	h := signed(newKey, oldKey)
	require.Equal(t, "v1=2026-12:", h.Get(signature.HeaderSignature)[:len("v1=2026-12:")])
	require.Equal(t, strconv.FormatInt(now.Unix(), 10), h.Get(signature.HeaderTimestamp))
	for name, v := range map[string]signature.Verifier{
		"receiver knows only the old key": verifier(oldKey),
		"receiver knows only the new key": verifier(newKey),
		"receiver knows both":             verifier(oldKey, newKey),
	} {
		id, err := v.Verify(h, body)
		require.NoError(t, err, name)
		require.Equal(t, "cb-1", id, name)
	}
	// After the rotation the sender signs with the new key alone: a
	// receiver still holding only the old one refuses.
	_, err := verifier(oldKey).Verify(signed(newKey), body)
	require.ErrorIs(t, err, signature.ErrNoMatch)
}

func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	v := verifier(newKey)
	cases := map[string]struct {
		header func() http.Header
		body   []byte
		want   error
	}{
		"tampered body": {func() http.Header { return signed(newKey) }, append([]byte{}, strings.Replace(string(body), "completed", "failed", 1)...), signature.ErrNoMatch},
		"unknown key":   {func() http.Header { return signed(signature.Key{ID: "other", Secret: newKey.Secret}) }, body, signature.ErrNoMatch},
		"wrong secret": {func() http.Header {
			return signed(signature.Key{ID: newKey.ID, Secret: []byte("not-the-secret-at-all")})
		}, body, signature.ErrNoMatch},
		"tampered timestamp": {func() http.Header {
			h := signed(newKey)
			h.Set(signature.HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))
			return h
		}, body, signature.ErrNoMatch},
		"no headers": {func() http.Header { return http.Header{} }, body, signature.ErrMissing},
		"bad timestamp": {func() http.Header {
			h := signed(newKey)
			h.Set(signature.HeaderTimestamp, "yesterday")
			return h
		}, body, signature.ErrMalformed},
		"bad hex": {func() http.Header {
			h := signed(newKey)
			h.Set(signature.HeaderSignature, "v1=2026-12:zz")
			return h
		}, body, signature.ErrMalformed},
	}
	for name, c := range cases {
		_, err := v.Verify(c.header(), c.body)
		require.ErrorIs(t, err, c.want, name)
	}
}

func TestVerifyReplayWindow(t *testing.T) {
	t.Parallel()
	h := signed(newKey)
	for _, d := range []time.Duration{6 * time.Minute, -6 * time.Minute} {
		v := signature.Verifier{Keys: []signature.Key{newKey}, Now: func() time.Time { return now.Add(d) }}
		_, err := v.Verify(h, body)
		require.ErrorIs(t, err, signature.ErrExpired, "clock off by %s", d)
	}
	v := signature.Verifier{Keys: []signature.Key{newKey}, Window: 10 * time.Minute, Now: func() time.Time { return now.Add(6 * time.Minute) }}
	_, err := v.Verify(h, body)
	require.NoError(t, err, "a wider window accepts it")
}

func TestValidateKeys(t *testing.T) {
	t.Parallel()
	require.NoError(t, signature.ValidateKeys([]signature.Key{newKey, oldKey}))
	for name, keys := range map[string][]signature.Key{
		"none":         nil,
		"three":        {newKey, oldKey, {ID: "x", Secret: newKey.Secret}},
		"short secret": {{ID: "k", Secret: []byte("short")}},
		"bad id":       {{ID: "a:b", Secret: newKey.Secret}},
		"same id":      {newKey, {ID: newKey.ID, Secret: oldKey.Secret}},
	} {
		require.Error(t, signature.ValidateKeys(keys), name)
	}
}
