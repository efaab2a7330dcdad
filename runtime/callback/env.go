package callback

import (
	"fmt"
	"strings"

	"github.com/protosaga/saga/runtime/callback/signature"
)

// Environment variables [FromEnv] reads (runtime/host reads them for
// host.Main).
const (
	// EnvKeys holds the signing keys, "ID:SECRET[,ID:SECRET]", current
	// first. Set, it turns the dispatcher on.
	EnvKeys = "SAGA_CALLBACK_KEYS"
	// EnvAllow opens refused address classes: "loopback", "private",
	// "link-local", comma-separated.
	EnvAllow = "SAGA_CALLBACK_ALLOW"
	// EnvClients registers client endpoints: "CLIENT=URL[,CLIENT=URL]".
	EnvClients = "SAGA_CALLBACK_CLIENTS"
)

// FromEnv returns a dispatcher configuration from the variables get
// returns, or nil when EnvKeys is empty.
func FromEnv(get func(string) string) (*Config, error) {
	keys := get(EnvKeys)
	if keys == "" {
		return nil, nil
	}
	var cfg Config
	var err error
	if cfg.Keys, err = signature.ParseKeys(keys); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvKeys, err)
	}
	for _, class := range strings.Split(get(EnvAllow), ",") {
		switch strings.TrimSpace(class) {
		case "":
		case "loopback":
			cfg.AllowPrivate.Loopback = true
		case "private":
			cfg.AllowPrivate.Private = true
		case "link-local":
			cfg.AllowPrivate.LinkLocal = true
		default:
			return nil, fmt.Errorf("%s: unknown address class %q (want loopback, private or link-local)", EnvAllow, class)
		}
	}
	if s := get(EnvClients); s != "" {
		cfg.Clients = map[string]string{}
		for _, part := range strings.Split(s, ",") {
			client, u, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || client == "" {
				return nil, fmt.Errorf("%s: %q: want CLIENT=URL", EnvClients, part)
			}
			if _, err := endpointKey(u); err != nil {
				return nil, fmt.Errorf("%s: client %q: %w", EnvClients, client, err)
			}
			cfg.Clients[client] = u
		}
	}
	return &cfg, nil
}
