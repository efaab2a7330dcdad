package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/protosaga/saga/runtime/admin"
)

// console is where the host serves the operator console, its API and
// /metrics while the demo runs.
type console struct {
	base        string // http://host:port
	admin       string // base + "/admin": the console, and sagactl's server
	repairToken string // empty when the tokens came from SAGA_ADMIN_TOKENS
	readToken   string
	out         func(format string, args ...any)
}

// adminTokens returns the tokens of SAGA_ADMIN_TOKENS, or makes up a repair
// and a read-only token (printed with the repair walkthrough).
func (d *demo) adminTokens(getenv func(string) string) (admin.Tokens, error) {
	spec := getenv(admin.EnvTokens)
	if spec == "" {
		d.repairToken, d.readToken = randomToken(), randomToken()
		spec = "operator:repair:" + d.repairToken + ",viewer:read:" + d.readToken
	}
	tokens, err := admin.ParseTokens(spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", admin.EnvTokens, err)
	}
	return tokens, nil
}

// freeAddr returns addr when it can be listened on, else a free loopback port.
func freeAddr(addr string) string {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "127.0.0.1:0"
	}
	_ = ln.Close()
	return addr
}

// console returns the started host's console addresses, and prints them.
func (d *demo) console() *console {
	base := "http://" + d.host.Addr()
	c := &console{base: base, admin: base + "/admin", repairToken: d.repairToken, readToken: d.readToken,
		out: func(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }}
	c.out("Operator console %s/  ·  API %s/api/  ·  metrics %s/metrics  ·  health %s/readyz\n", c.admin, c.admin, c.base, c.base)
	return c
}

// serveUntil keeps the process (and so the console and the fleet) running
// until ctx ends (Ctrl-C) or, when for > 0, for that long.
func (c *console) serveUntil(ctx context.Context, serveFor time.Duration) {
	if serveFor > 0 {
		c.out("\nServing for %s.\n", serveFor)
		select {
		case <-ctx.Done():
		case <-time.After(serveFor):
		}
		return
	}
	c.out("\nServing the console until Ctrl-C (then the services stop).\n")
	<-ctx.Done()
}

// repairHelp prints how to find and repair the parked order, with the
// console and with sagactl.
func (d *demo) repairHelp(ctx context.Context, c *console, serving bool) error {
	u := d.first(unserved)
	var parkedID int64
	if err := d.pool.QueryRow(ctx, `SELECT id FROM saga_parked WHERE saga_id = $1 AND replayed_at IS NULL ORDER BY id DESC LIMIT 1`,
		u.sagaID).Scan(&parkedID); err != nil {
		return fmt.Errorf("find the parked shipping command of %s: %w", u.id, err)
	}
	token := c.repairToken
	if token == "" {
		token = "<a repair token from " + admin.EnvTokens + ">"
	}
	fmt.Fprintf(d.out, "\nRepair the parked order %s (saga %s)\n", u.id, u.sagaID)
	if c.repairToken != "" {
		fmt.Fprintf(d.out, "  console  %s/  sign in with the repair token %s (read-only: %s)\n", c.admin, c.repairToken, c.readToken)
	} else {
		fmt.Fprintf(d.out, "  console  %s/  sign in with a token from %s\n", c.admin, admin.EnvTokens)
	}
	fmt.Fprintf(d.out, `  1. see it:      parked messages and sagas in manual review in the console, or
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl parked list
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl sagas list --review
  2. fix the cause: psql "%[3]s" -c "INSERT INTO shipping_carriers (country, carrier) VALUES ('%[4]s', 'Norðurpóstur')"
  3. replay it:   the Replay button on parked message %[5]d, or
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl parked replay %[5]d --reason "carrier for %[4]s added"
  4. watch it complete:
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl sagas show %[6]s
  metrics:        curl -s %[7]s/metrics | grep '^saga_'
`, c.admin, token, d.pgURL, unservedCountry, parkedID, u.sagaID, c.base)
	if !serving {
		fmt.Fprintf(d.out, "  (run make demo from a terminal to keep the console up after the summary; -serve forces it)\n")
	}
	return nil
}

// randomToken returns 32 random hex characters.
func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// redactURL hides a URL's password for printing.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<database url>"
	}
	return u.Redacted()
}

// isTerminal reports whether f is a terminal: one that answers the termios
// ioctl. /dev/null is a character device too, but not a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
