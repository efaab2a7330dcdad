package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"time"

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
// until ctx ends (Ctrl-C, SIGTERM) or, when for > 0, for that long.
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
// console and with sagactl. It names the saga, never one parked copy: the
// step resends its command when its timeout passes (each copy is parked
// again) and, after its last attempt, the saga goes to manual review;
// retrying the step and then dismissing the copies that no longer apply is
// right at every one of those moments.
func (d *demo) repairHelp(ctx context.Context, c *console, serving bool) error {
	u := d.first(unserved)
	step, ok := d.placeOrder.Engine().Definition().LookupStep("ScheduleShipping")
	if !ok {
		return errors.New("the Place Order contract has no ScheduleShipping step")
	}
	timeout := step.Timeout
	if t, ok := d.stepTimeouts[step.Name]; ok {
		timeout = t
	}
	var poison int64
	if err := d.pool.QueryRow(ctx, `SELECT id FROM saga_parked WHERE message_id = $1 ORDER BY id DESC LIMIT 1`,
		d.runID+poisonMsgID).Scan(&poison); err != nil {
		return fmt.Errorf("find the parked poison message %s%s: %w", d.runID, poisonMsgID, err)
	}
	token := c.repairToken
	if token == "" {
		token = "<a repair token from " + admin.EnvTokens + ">"
	}
	const sagactl = "go run ./cmd/sagactl"
	fmt.Fprintf(d.out, "\nRepair the parked order %s (saga %s)\n", u.id, u.sagaID)
	fmt.Fprintf(d.out, `  It waits in SCHEDULE_SHIPPING: its ScheduleShipping command was parked (no carrier serves %[1]s).
  Every %[2]s its step resends the command, which is parked again; after %[3]d attempts the saga waits in
  MANUAL_REVIEW. The steps below are right at every one of those moments.
`, unservedCountry, timeout, max(step.MaxAttempts, 1))
	if c.repairToken != "" {
		fmt.Fprintf(d.out, "  console  %s/  sign in with the repair token %s (read-only: %s)\n", c.admin, c.repairToken, c.readToken)
	} else {
		fmt.Fprintf(d.out, "  console  %s/  sign in with a token from %s\n", c.admin, admin.EnvTokens)
	}
	fmt.Fprintf(d.out, "  sagactl  in a shell at the repository's root: export SAGACTL_SERVER=%s SAGACTL_TOKEN=%s\n", c.admin, token)
	fmt.Fprintf(d.out, `  1. see it:        the console's Parked page, or the saga's page %[1]s/#/saga/%[2]s
                    %[3]s sagas show %[2]s
                    %[3]s parked list --saga %[2]s
  2. fix the cause: psql "%[4]s" -c "INSERT INTO shipping_carriers (country, carrier) VALUES ('%[5]s', 'Norðurpóstur')"
  3. resend it:     on the saga's page, Retry step… (give a reason, press the button), or
                    %[3]s sagas retry %[2]s --reason "carrier for %[5]s added"
  4. see it done:   %[3]s sagas show %[2]s        (COMPLETED within seconds)
  5. close the parked copies that no longer apply: on the saga's page, Dismiss superseded…, or
                    %[3]s parked dismiss --saga %[2]s --reason "resent by retry"
  6. and the poison message, which names no saga:
                    %[3]s parked dismiss %[6]d --reason "undecodable; the sender is fixed"
  then:             curl -s %[7]s/metrics | grep saga_parked_messages     (every queue at 0)
                    %[3]s log                                 (who did what, and why)
`, c.admin, u.sagaID, sagactl, d.pgURL, unservedCountry, poison, c.base)
	if d.logPath != "" {
		fmt.Fprintf(d.out, "  logs (JSON):      %s   e.g. grep '\"saga_id\":\"%s\"' it\n", d.logPath, u.sagaID)
	}
	fmt.Fprintf(d.out, `  start an order:   curl -s -X POST %s/sagas/place_order -H 'Content-Type: application/json' \
                      -d '{"orderId":"my-order-1","customerId":"me","lines":[{"productId":"widget","quantity":1}],"amount":{"currency":"EUR","minorUnits":1200},"shippingAddress":{"country":"FR"},"cardToken":"tok_visa"}'
`, c.base)
	if !serving {
		fmt.Fprintf(d.out, "  (this run does not serve after the summary: -serve=false)\n")
	}
	return nil
}

// stepTimeoutFlag collects -step-timeout STEP=DURATION.
type stepTimeoutFlag map[string]time.Duration

func (f stepTimeoutFlag) String() string {
	parts := make([]string, 0, len(f))
	for k, v := range f {
		parts = append(parts, k+"="+v.String())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (f stepTimeoutFlag) Set(v string) error {
	step, d, ok := strings.Cut(v, "=")
	if !ok || step == "" {
		return fmt.Errorf("%q: want STEP=DURATION, e.g. ScheduleShipping=5s", v)
	}
	t, err := time.ParseDuration(d)
	if err != nil || t <= 0 {
		return fmt.Errorf("%q: want a positive duration", v)
	}
	f[step] = t
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
