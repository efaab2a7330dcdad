package admin_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/browsertest"
)

// console is a headless Chromium on the bundle's console.
type console struct {
	t   *testing.T
	ctx context.Context
	b   *bundle
}

// openConsole starts a browser on the console and signs in with token.
func openConsole(t *testing.T, b *bundle, token string) *console {
	t.Helper()
	c := &console{t: t, ctx: browsertest.New(t), b: b}
	c.run(
		chromedp.Navigate(b.http.URL+"/"),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", token, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("#who-name", chromedp.ByQuery),
	)
	return c
}

func (c *console) run(actions ...chromedp.Action) {
	c.t.Helper()
	require.NoError(c.t, chromedp.Run(c.ctx, actions...))
}

// text returns the text of the first element sel matches, once visible.
func (c *console) text(sel string) string {
	c.t.Helper()
	var s string
	c.run(chromedp.WaitVisible(sel, chromedp.ByQuery), chromedp.Text(sel, &s, chromedp.ByQuery))
	return s
}

// eval evaluates a JavaScript expression into out.
func (c *console) eval(js string, out any) {
	c.t.Helper()
	c.run(chromedp.Evaluate(js, out))
}

// count returns how many elements sel matches.
func (c *console) count(sel string) int {
	c.t.Helper()
	var n int
	c.eval(fmt.Sprintf(`document.querySelectorAll(%q).length`, sel), &n)
	return n
}

// visibleCount returns how many elements sel matches that are rendered.
func (c *console) visibleCount(sel string) int {
	c.t.Helper()
	var n int
	c.eval(fmt.Sprintf(`[...document.querySelectorAll(%q)].filter((e) => e.getClientRects().length > 0).length`, sel), &n)
	return n
}

// open navigates to the console's hash route, waits until the console has
// rendered it, and for sel.
func (c *console) open(hash, sel string) {
	c.t.Helper()
	if hash == "" {
		c.run(chromedp.Navigate(c.b.http.URL + "/"))
		c.waitFor(`document.body.dataset.route !== ""`)
	} else {
		// A new hash is a navigation within the page: set it as a link
		// would (chromedp.Navigate may wait for a load that never comes).
		var url string
		c.run(chromedp.Location(&url))
		if !strings.HasPrefix(url, c.b.http.URL+"/") {
			c.run(chromedp.Navigate(c.b.http.URL + "/"))
		}
		c.eval(fmt.Sprintf(`(() => { document.body.dataset.route = ""; if (location.hash === %q) window.dispatchEvent(new HashChangeEvent("hashchange")); else location.hash = %q; return true; })()`, hash, hash), new(bool))
		c.waitFor(fmt.Sprintf(`document.body.dataset.route === %q`, hash))
	}
	c.run(chromedp.WaitVisible(sel, chromedp.ByQuery))
}

// waitFor polls a JavaScript predicate until it holds.
func (c *console) waitFor(predicate string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	require.NoError(c.t, chromedp.Run(ctx, chromedp.Poll(predicate, nil, chromedp.WithPollingInterval(100*time.Millisecond))),
		"waiting for %s", predicate)
}

// overflowJS lists what sticks out sideways: a page that scrolls
// horizontally, a rendered element beyond the right (or left) edge of the
// viewport, a table wider than its box, a cell whose content spills into
// its neighbour. What a scrolled box holds (the diagram at its size, a
// long body) is clipped by that box, by design, and not counted.
const overflowJS = `(() => {
	const w = document.documentElement.clientWidth;
	const bad = [];
	if (document.documentElement.scrollWidth > w) bad.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + w);
	const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
		(typeof e.className === "string" && e.className ? "." + e.className.trim().split(/\s+/).join(".") : "");
	const scrolled = (e) => {
		for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
			if (/(auto|scroll|hidden)/.test(getComputedStyle(p).overflowX)) return true;
		}
		return false;
	};
	for (const e of document.querySelectorAll("body *")) {
		const r = e.getBoundingClientRect();
		if (r.width === 0 && r.height === 0) continue;
		if ((r.right > w + 1 || r.left < -1) && !scrolled(e)) bad.push(name(e) + " spans " + Math.round(r.left) + ".." + Math.round(r.right) + " of " + w);
		if (e.tagName === "TABLE" && e.scrollWidth > e.clientWidth + 1) bad.push(name(e) + " is wider than its box");
		if ((e.tagName === "TD" || e.tagName === "TH") && e.scrollWidth > e.clientWidth + 1) bad.push(name(e) + " spills " + (e.scrollWidth - e.clientWidth) + "px: " + e.textContent.slice(0, 60));
	}
	return bad.slice(0, 15);
})()`

// noOverflow fails the test when anything sticks out sideways.
func (c *console) noOverflow(view string) {
	c.t.Helper()
	var bad []string
	c.eval(overflowJS, &bad)
	require.Empty(c.t, bad, "%s: horizontal overflow", view)
}

// screenshot saves a full-page PNG of the view in the test's artifact
// directory (go test -artifacts keeps it) and checks it is one.
func (c *console) screenshot(name string, width int) {
	c.t.Helper()
	var buf []byte
	c.run(chromedp.FullScreenshot(&buf, 100))
	img, err := png.Decode(bytes.NewReader(buf))
	require.NoError(c.t, err, "%s: not a PNG", name)
	require.Equal(c.t, width, img.Bounds().Dx(), "%s: screenshot width", name)
	path := filepath.Join(c.t.ArtifactDir(), name+".png")
	require.NoError(c.t, os.WriteFile(path, buf, 0o644))
	c.t.Logf("screenshot %s", path)
}

// setViewport sizes the page.
func (c *console) setViewport(w, h int) {
	c.t.Helper()
	c.run(chromedp.EmulateViewport(int64(w), int64(h)))
}

// confirmOpen waits for the confirmation dialog and returns its effect.
func (c *console) confirmOpen() string {
	c.t.Helper()
	c.waitFor(`document.getElementById("confirm").open`)
	return c.text("#confirm-effect")
}

// confirm types the reason and presses the dialog's button.
func (c *console) confirm(reason string) {
	c.t.Helper()
	c.confirmOpen()
	c.run(chromedp.SendKeys("#confirm-reason", reason, chromedp.ByQuery), chromedp.Click("#confirm-ok", chromedp.ByQuery))
	c.waitFor(`!document.getElementById("confirm").open`)
}

// dialogOpen reports whether the confirmation dialog is open.
func (c *console) dialogOpen() bool {
	c.t.Helper()
	var open bool
	c.eval(`document.getElementById("confirm").open`, &open)
	return open
}

// optionValues lists the values of a select's options.
func (c *console) optionValues(sel string) []string {
	c.t.Helper()
	var out []string
	c.eval(fmt.Sprintf(`[...document.querySelectorAll(%q)].map((o) => o.value)`, sel+" option"), &out)
	return out
}

func containsAll(t *testing.T, s string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		require.True(t, strings.Contains(s, p), "%q does not contain %q", s, p)
	}
}

// attr returns an attribute of the first element sel matches.
func (c *console) attr(sel, name string) string {
	c.t.Helper()
	var v string
	c.eval(fmt.Sprintf(`(document.querySelector(%q) || {getAttribute: () => ""}).getAttribute(%q) || ""`, sel, name), &v)
	return v
}

// value returns the value of the form field sel matches.
func (c *console) value(sel string) string {
	c.t.Helper()
	var v string
	c.eval(fmt.Sprintf(`document.querySelector(%q).value`, sel), &v)
	return v
}

// ids lists the ids of the elements sel matches.
func (c *console) ids(sel string) []string {
	c.t.Helper()
	var out []string
	c.eval(fmt.Sprintf(`[...document.querySelectorAll(%q)].map((e) => e.id)`, sel), &out)
	return out
}

// disabled reports whether the element sel matches is disabled.
func (c *console) disabled(sel string) bool {
	c.t.Helper()
	var v bool
	c.eval(fmt.Sprintf(`document.querySelector(%q).disabled`, sel), &v)
	return v
}

// setValue sets a form field's value as a user would, with its input and
// change events.
func (c *console) setValue(sel, v string) {
	c.t.Helper()
	var ok bool
	c.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.value = %q;
		e.dispatchEvent(new Event("input", {bubbles: true})); e.dispatchEvent(new Event("change", {bubbles: true})); return e.value === %q; })()`, sel, v, v), &ok)
	require.True(c.t, ok, "set %s to %q", sel, v)
}

// waitRoute waits until the console has rendered a view whose hash holds
// part.
func (c *console) waitRoute(part string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf(`document.body.dataset.route.includes(%q)`, part))
}
