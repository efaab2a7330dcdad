package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
	"github.com/protosaga/saga/runtime/telemetry/promexport"
)

// console is the operator console, its API and /metrics, served while the
// demo runs.
type console struct {
	base        string // http://host:port
	repairToken string // empty when the tokens came from SAGA_ADMIN_TOKENS
	readToken   string
	srv         *http.Server
	out         func(format string, args ...any)
}

// startConsole serves the admin console and API (runtime/admin) and the
// Prometheus metrics on addr, or on a free port when addr is taken.
func (d *demo) startConsole(ctx context.Context, addr string, prom *promexport.Exporter, logger *slog.Logger, getenv func(string) string) (*console, error) {
	defs := []*sagadef.Definition{d.app.PlaceOrder.Engine().Definition()}
	meter := prom.MeterProvider().Meter(telemetry.ScopeName)
	if _, err := telemetry.RegisterSagaGauges(meter, d.pool, defs); err != nil {
		return nil, fmt.Errorf("saga gauges: %w", err)
	}
	if _, err := telemetry.RegisterOutboxGauges(meter, d.pool); err != nil {
		return nil, fmt.Errorf("outbox gauges: %w", err)
	}
	c := &console{out: func(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }}
	spec := getenv(admin.EnvTokens)
	if spec == "" {
		c.repairToken, c.readToken = randomToken(), randomToken()
		spec = "operator:repair:" + c.repairToken + ",viewer:read:" + c.readToken
	}
	tokens, err := admin.ParseTokens(spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", admin.EnvTokens, err)
	}
	adm, err := admin.New(admin.Config{Pool: d.pool, Sagas: []*saga.Engine{d.app.PlaceOrder.Engine()}, Tokens: tokens, Logger: logger})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", prom.MetricsHandler())
	mux.Handle("/", adm)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen for the console: %w", err)
		}
	}
	c.base = "http://" + ln.Addr().String()
	c.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := c.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.ErrorContext(ctx, "console server stopped", "error", err)
		}
	}()
	c.out("Operator console %s/  ·  API %s/api/  ·  metrics %s/metrics\n", c.base, c.base, c.base)
	return c, nil
}

func (c *console) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.srv.Shutdown(ctx)
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
		fmt.Fprintf(d.out, "  console  %s/  sign in with the repair token %s (read-only: %s)\n", c.base, c.repairToken, c.readToken)
	} else {
		fmt.Fprintf(d.out, "  console  %s/  sign in with a token from %s\n", c.base, admin.EnvTokens)
	}
	fmt.Fprintf(d.out, `  1. see it:      parked messages and sagas in manual review in the console, or
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl parked list
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl sagas list --review
  2. fix the cause: psql "%[3]s" -c "INSERT INTO shipping_carriers (country, carrier) VALUES ('%[4]s', 'Norðurpóstur')"
  3. replay it:   the Replay button on parked message %[5]d, or
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl parked replay %[5]d --reason "carrier for %[4]s added"
  4. watch it complete:
                  SAGACTL_SERVER=%[1]s SAGACTL_TOKEN=%[2]s go run ./cmd/sagactl sagas show %[6]s
  metrics:        curl -s %[1]s/metrics | grep '^saga_'
`, c.base, token, d.pgURL, unservedCountry, parkedID, u.sagaID)
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
