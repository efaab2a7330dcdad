package callback_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/callback"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := callback.FromEnv(env(nil))
	require.NoError(t, err)
	require.Nil(t, cfg, "no keys: no dispatcher")

	cfg, err = callback.FromEnv(env(map[string]string{
		callback.EnvKeys:    "k2:second-secret-0123456789,k1:first-secret-0123456789",
		callback.EnvAllow:   "loopback, private",
		callback.EnvClients: "acme=https://acme.example/hooks",
	}))
	require.NoError(t, err)
	require.Equal(t, []string{"k2", "k1"}, []string{cfg.Keys[0].ID, cfg.Keys[1].ID})
	require.Equal(t, callback.AllowPrivate{Loopback: true, Private: true}, cfg.AllowPrivate)
	require.Equal(t, map[string]string{"acme": "https://acme.example/hooks"}, cfg.Clients)

	for name, m := range map[string]map[string]string{
		"short secret":  {callback.EnvKeys: "k:short"},
		"no id":         {callback.EnvKeys: "secret-without-id-0123"},
		"unknown class": {callback.EnvKeys: "k:first-secret-0123456789", callback.EnvAllow: "everything"},
		"bad client":    {callback.EnvKeys: "k:first-secret-0123456789", callback.EnvClients: "acme=ftp://x"},
	} {
		_, err := callback.FromEnv(env(m))
		require.Error(t, err, name)
	}
}
