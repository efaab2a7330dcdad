package admin_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
)

var (
	chromiumOnce sync.Once
	chromiumPath string
	chromiumErr  string
)

// findChromium returns the path of a Chromium (or Chrome) binary: $CHROMIUM,
// else the usual names on PATH. Under CI=true, running as root, it installs
// Debian's chromium package when none is found. It returns "" and why when
// there is none.
func findChromium() (string, string) {
	chromiumOnce.Do(func() {
		look := func() string {
			if p := os.Getenv("CHROMIUM"); p != "" {
				return p
			}
			for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
				if p, err := exec.LookPath(name); err == nil {
					return p
				}
			}
			return ""
		}
		if chromiumPath = look(); chromiumPath != "" {
			return
		}
		if os.Getenv("CI") != "true" || os.Geteuid() != 0 {
			chromiumErr = "no chromium on PATH (install Debian's package: apt-get install -y chromium)"
			return
		}
		var out strings.Builder
		for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "chromium"}} {
			cmd := exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				chromiumErr = "apt-get " + strings.Join(args, " ") + ": " + err.Error() + "\n" + out.String()
				return
			}
		}
		if chromiumPath = look(); chromiumPath == "" {
			chromiumErr = "chromium installed but not found on PATH"
		}
	})
	return chromiumPath, chromiumErr
}

// browser returns a chromedp context on a fresh headless Chromium. The test
// is skipped when there is no Chromium, except under CI=true, where that is
// a failure.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, why := findChromium()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("browser test needs Chromium under CI: %s", why)
		}
		t.Skipf("browser test skipped: %s", why)
	}
	// A fresh profile per test. Not t.TempDir: Chromium's helper processes
	// may still write into it for a moment after the browser exits.
	profile, err := os.MkdirTemp("", "saga-console-chromium-")
	require.NoError(t, err)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("could not remove chromium profile %s", profile)
	})
	require.NoError(t, chromedp.Run(ctx), "start chromium %s", path)
	return ctx
}

// The console end to end in a real browser: sign in, list sagas (all and
// stuck), list parked messages, open a timeline, replay a parked message.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)

	stuck := b.start(t, "order-browser-stuck")
	b.clock.Advance(time.Minute)
	id := b.start(t, "order-browser")
	env := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-browser"})
	pid := b.park(t, env, "order.saga.place_order", "fold failed: inventory reply rejected")

	var sagas, stuckRows, parked, who, current, summary, events, page, result string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.http.URL+"/"),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", repairToken, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("tr.saga-row", chromedp.ByQuery),
		chromedp.Text("#saga-rows", &sagas, chromedp.ByQuery),
		chromedp.Text("#who-name", &who, chromedp.ByQuery),

		chromedp.Click("#nav-stuck", chromedp.ByQuery),
		chromedp.WaitVisible("#f-stuck:checked", chromedp.ByQuery),
		chromedp.WaitVisible("tr.saga-row", chromedp.ByQuery),
		chromedp.Text("#saga-rows", &stuckRows, chromedp.ByQuery),

		chromedp.Click("#nav-parked", chromedp.ByQuery),
		chromedp.WaitVisible("tr.parked-row", chromedp.ByQuery),
		chromedp.Text("#parked-rows", &parked, chromedp.ByQuery),
	))
	require.Equal(t, "alice (repair)", who)
	require.Contains(t, sagas, "order-browser-stuck")
	require.Contains(t, sagas, "order-browser")
	require.Contains(t, stuckRows, stuck)
	require.Contains(t, stuckRows, "timeout due")
	require.NotContains(t, stuckRows, id)
	require.Contains(t, parked, "fold failed: inventory reply rejected")
	require.Contains(t, parked, "order-browser")
	require.Contains(t, parked, "ReserveInventory")

	// Open the parked message's saga: its timeline and position.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click("tr.parked-row td:nth-child(3) a", chromedp.ByQuery),
		chromedp.WaitVisible("#position-summary", chromedp.ByQuery),
		chromedp.Text("#states li.current", &current, chromedp.ByQuery),
		chromedp.Text("#position-summary", &summary, chromedp.ByQuery),
		chromedp.Text("#events", &events, chromedp.ByQuery),
		chromedp.OuterHTML("body", &page, chromedp.ByQuery),
	))
	require.Equal(t, "RESERVE_INVENTORY", current)
	require.Contains(t, summary, "step ReserveInventory (compensatable) waits for the reply to ReserveInventory")
	require.Contains(t, events, "sent ReserveInventory")
	require.Contains(t, events, "parked InventoryReserved")
	require.Contains(t, page, "[REDACTED]")
	require.NotContains(t, page, cardToken, "sensitive fields never reach the browser")
	require.NotContains(t, page, "[object ", "every value renders as text, never as a stringified DOM node")
	require.Contains(t, page, "<dt>Business key</dt>", "the saga's header lists its fields")

	// Its state diagram: an inline SVG with the current state highlighted,
	// the Mermaid source still there, folded.
	var highlighted string
	var ok bool
	var diagram struct {
		States, Current, Scripts int
		MermaidFolded            bool
	}
	const inspect = `({
		States: document.querySelectorAll("#diagram svg g.state").length,
		Current: document.querySelectorAll("#diagram svg g.state.current").length,
		Scripts: document.querySelectorAll("#diagram script, #diagram foreignObject").length,
		MermaidFolded: !!document.querySelector("#mermaid") && !document.querySelector("#mermaid").closest("details").open,
	})`
	require.NoError(t, chromedp.Run(ctx,
		chromedp.WaitVisible("#diagram svg g.state.current", chromedp.ByQuery),
		chromedp.AttributeValue("#diagram svg g.state.current", "data-state", &highlighted, &ok, chromedp.ByQuery),
		chromedp.Evaluate(inspect, &diagram),
	))
	require.True(t, ok)
	require.Equal(t, "RESERVE_INVENTORY", highlighted)
	require.Equal(t, 9, diagram.States, "every state of Place Order drawn")
	require.Equal(t, 1, diagram.Current)
	require.Zero(t, diagram.Scripts)
	require.True(t, diagram.MermaidFolded, "the Mermaid source stays, folded")

	// The saga type's page: the same diagram, nothing highlighted.
	var typeName string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click(".grid dd a", chromedp.ByQuery),
		chromedp.WaitVisible("#type-name", chromedp.ByQuery),
		chromedp.WaitVisible("#diagram svg g.state", chromedp.ByQuery),
		chromedp.Text("#type-name", &typeName, chromedp.ByQuery),
		chromedp.Evaluate(inspect, &diagram),
		chromedp.NavigateBack(),
		chromedp.WaitVisible("#events button.replay-button", chromedp.ByQuery),
	))
	require.Equal(t, "shop.order.v1.PlaceOrder", typeName)
	require.Equal(t, 9, diagram.States)
	require.Zero(t, diagram.Current, "no saga, no highlight")

	// Replay it from the timeline.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click("#events button.replay-button", chromedp.ByQuery),
		chromedp.WaitVisible("input.replay-reason", chromedp.ByQuery),
		chromedp.SendKeys("input.replay-reason", "fixed the fold, replaying", chromedp.ByQuery),
		chromedp.Click("button.replay-confirm", chromedp.ByQuery),
		chromedp.WaitVisible(".replay-result .badge.replayed", chromedp.ByQuery),
		chromedp.Text(".replay-result", &result, chromedp.ByQuery),
	))
	require.Contains(t, result, "replayed")
	require.Contains(t, result, "it will be applied")
	var by string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT replayed_by FROM saga_parked WHERE id = $1`, pid).Scan(&by))
	require.Equal(t, "alice", by)
	require.Equal(t, 1, b.outboxOf(t, env.MessageID).Count, "back in the outbox with its own message id")

	// The token survives a reload (session storage); a read-only token sees
	// no replay buttons.
	var readOnly string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Reload(),
		chromedp.WaitVisible("#who-name", chromedp.ByQuery),
		chromedp.Click("#logout", chromedp.ByQuery),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", readToken, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("tr.saga-row", chromedp.ByQuery),
		chromedp.Navigate(b.http.URL+"/#/parked?include_replayed=true"),
		chromedp.WaitVisible("tr.parked-row", chromedp.ByQuery),
		chromedp.Text("#parked-rows", &readOnly, chromedp.ByQuery),
	))
	require.Contains(t, readOnly, "replayed by alice fixed the fold, replaying", "who and why")

	// A timeline cut to the newest rows says so.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO saga_audit (saga_id, saga_type, from_state, to_state, trigger, class, version)
SELECT $1::uuid, 'shop.order.v1.PlaceOrder', 'RESERVE_INVENTORY', 'RESERVE_INVENTORY', 'operator.note', 'new', 1 FROM generate_series(1, 1001)`, stuck)
	require.NoError(t, err)
	var cut string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.http.URL+"/#/saga/"+stuck),
		chromedp.WaitVisible("#timeline-truncated", chromedp.ByQuery),
		chromedp.Text("#timeline-truncated", &cut, chromedp.ByQuery),
	))
	require.Contains(t, cut, "only the newest 1000 of each are shown")
}
