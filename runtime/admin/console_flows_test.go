package admin_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/browsertest"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
)

// complete drives a new saga to COMPLETED.
func (b *bundle) complete(t *testing.T, order string) string {
	t.Helper()
	id := b.toShipping(t, order)
	b.reply(t, id, &shippingv1.ShippingScheduled{OrderId: order, TrackingId: "T-" + order})
	b.reply(t, id, &orderv1.OrderApproved{OrderId: order})
	require.Equal(t, "COMPLETED", b.status(t, id).State)
	return id
}

// supersededAndCurrent drives a saga to SCHEDULE_SHIPPING with its command
// parked, resent by its timeout and parked again: a superseded copy and a
// current one.
func (b *bundle) supersededAndCurrent(t *testing.T, order string) (id string, superseded, current int64) {
	t.Helper()
	id = b.toShipping(t, order)
	superseded = b.parkCommand(t, id, "shipping.commands", `shipping: no carrier serves country "IS" (order `+order+`); add one to shipping_carriers, then replay this message`)
	b.clock.Advance(2 * time.Minute)
	_, err := b.engine.FireTimeouts(t.Context(), 100)
	require.NoError(t, err)
	current = b.parkCommand(t, id, "shipping.commands", `shipping: no carrier serves country "IS" (order `+order+`); add one to shipping_carriers, then replay this message`)
	return id, superseded, current
}

// TestConsoleSignIn: a wrong token is refused with a word and not kept; too
// many wrong ones are refused with the wait; the right one signs in and
// survives a reload; a token rotated away sends the operator back to
// sign in, saying why.
func TestConsoleSignIn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, "order-sign-in")
	ctx := browsertest.New(t)
	c := &console{t: t, ctx: ctx, b: b}

	var stored string
	c.run(
		chromedp.Navigate(b.http.URL+"/"),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", "wrong-token-0123456789abcdef", chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("#login-error", chromedp.ByQuery),
		chromedp.Evaluate(`sessionStorage.getItem("saga-admin-token") || ""`, &stored),
	)
	require.Contains(t, c.text("#login-error"), "That token was not accepted")
	require.Empty(t, stored, "a refused token is not kept")
	require.Equal(t, 1, c.visibleCount("#login-form"), "still at the sign-in form")

	c.setValue("#token", "")
	c.run(
		chromedp.SendKeys("#token", repairToken, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("tr.saga-row", chromedp.ByQuery),
	)
	require.Equal(t, "alice (repair)", c.text("#who-name"))
	require.Equal(t, 0, c.visibleCount("#login-error"))
	c.run(chromedp.Reload(), chromedp.WaitVisible("tr.saga-row", chromedp.ByQuery))
	require.Equal(t, "alice (repair)", c.text("#who-name"), "the token survives a reload (session storage)")

	// The tokens are rotated: the next call sends the operator back.
	require.NoError(t, b.server.SetTokens(admin.Tokens{"rotated-token-0123456789abcdef": {Name: "alice", Role: admin.RoleRepair}}))
	c.run(chromedp.Click("#nav-parked", chromedp.ByQuery))
	c.waitRoute("sign-in")
	require.Contains(t, c.text("#login-error"), "no longer accepted")
	require.NoError(t, b.server.SetTokens(tokens))

	// A server that limits failed sign-ins says how long to wait.
	limited, err := admin.New(admin.Config{Pool: b.pool, Sagas: []*saga.Engine{b.engine}, Tokens: tokens, Now: b.clock.Now,
		Logger: slog.New(slog.DiscardHandler), MaxFailedSignIns: 1})
	require.NoError(t, err)
	hs := httptest.NewServer(limited)
	t.Cleanup(hs.Close)
	c.run(chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible("#token", chromedp.ByQuery))
	for range 2 {
		c.setValue("#token", "")
		c.run(
			chromedp.SendKeys("#token", "wrong-token-0123456789abcdef", chromedp.ByQuery),
			chromedp.Click("#login-submit", chromedp.ByQuery),
			chromedp.WaitVisible("#login-error", chromedp.ByQuery),
		)
	}
	c.waitFor(`document.getElementById("login-error").textContent.includes("Too many failed sign-ins")`)
	require.Contains(t, c.text("#login-error"), "try again in")
}

// TestConsoleFind: counts per type and state lead to their sagas; the
// State filter offers every state and filters by it; business key prefix,
// order and creation window; the search box finds by saga id, business key
// prefix and message id; the parked list filters by reason and previews a
// bulk replay per item before running it.
func TestConsoleFind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	review := b.manualReview(t, "find-review")
	b.clock.Advance(time.Second)
	first := b.start(t, "find-1")
	b.clock.Advance(time.Second)
	second := b.start(t, "find-2")
	b.reply(t, second, &inventoryv1.InventoryReserved{OrderId: "find-2"}) // AUTHORIZE_PAYMENT
	b.clock.Advance(time.Second)
	other := b.start(t, "other-3")
	fold := b.park(t, b.replyEnvelope(t, first, &inventoryv1.InventoryReserved{OrderId: "find-1"}), "order.saga.place_order", "fold failed: bug 17")
	b.park(t, b.replyEnvelope(t, other, &inventoryv1.InventoryReserved{OrderId: "other-3"}), "order.saga.place_order", "schema version mismatch")

	c := openConsole(t, b, repairToken)
	c.run(chromedp.WaitVisible("#counts a.state-count", chromedp.ByQuery))
	require.Equal(t, 9, c.count(`#counts .type-counts a.state-count`), "every state of Place Order has its count")
	var counts map[string]string
	c.eval(`Object.fromEntries([...document.querySelectorAll("#counts a.state-count")].map((a) => [a.dataset.state, a.querySelector("b").textContent]))`, &counts)
	require.Equal(t, "2", counts["RESERVE_INVENTORY"])
	require.Equal(t, "1", counts["AUTHORIZE_PAYMENT"])
	require.Equal(t, "1", counts["MANUAL_REVIEW"])
	require.Equal(t, "0", counts["COMPLETED"])
	require.Contains(t, c.text("#parked-count"), "2")
	c.run(chromedp.Click(`#counts a.state-count[data-state="MANUAL_REVIEW"]`, chromedp.ByQuery))
	c.waitRoute("state=MANUAL_REVIEW")
	require.Equal(t, 1, c.count("tr.saga-row"), "the count leads to its sagas")

	// The State filter offers every state, and filters.
	c.open("#/sagas", "tr.saga-row")
	require.Equal(t, []string{"", "RESERVE_INVENTORY", "AUTHORIZE_PAYMENT", "SCHEDULE_SHIPPING", "APPROVE_ORDER",
		"COMPENSATING_RESERVE_INVENTORY", "MANUAL_REVIEW", "COMPLETED", "FAILED", "CANCELLED"}, c.optionValues("#f-state"))
	c.setValue("#f-state", "AUTHORIZE_PAYMENT")
	c.run(chromedp.Click("#f-apply", chromedp.ByQuery))
	c.waitRoute("state=AUTHORIZE_PAYMENT")
	require.Equal(t, 1, c.count("tr.saga-row"))
	require.Equal(t, second, c.attr("tr.saga-row", "data-id"))
	require.Equal(t, "AUTHORIZE_PAYMENT", c.value("#f-state"), "the filter shows what it applies")

	// Business key prefix, oldest first; a creation window.
	c.open("#/sagas?key_prefix=find-&sort=oldest", `tr.saga-row[data-id="`+second+`"]`)
	var order []string
	c.eval(`[...document.querySelectorAll("tr.saga-row")].map((r) => r.dataset.id)`, &order)
	require.Equal(t, []string{review, first, second}, order)
	after := b.status(t, first).CreatedAt.Add(500 * time.Millisecond).UTC().Format(time.RFC3339)
	c.open("#/sagas?created_after="+after, `tr.saga-row[data-id="`+other+`"]`)
	c.eval(`[...document.querySelectorAll("tr.saga-row")].map((r) => r.dataset.id)`, &order)
	require.Equal(t, []string{other, second}, order)
	require.NotEmpty(t, c.value("#f-from"), "the window shows in its field")

	// The search box: a saga id goes to its saga; a prefix lists them; a
	// message id finds its saga.
	search := func(q string) {
		t.Helper()
		c.setValue("#q", "")
		c.run(chromedp.SendKeys("#q", q+"\r", chromedp.ByQuery))
		c.waitFor(fmt.Sprintf(`document.body.dataset.route === %q`, "#/search?q="+url.QueryEscape(q)))
	}
	search(first)
	require.Contains(t, c.text("#search-results"), "saga id")
	require.Contains(t, c.text("#search-results"), "find-1")
	search("find-")
	require.Equal(t, 3, c.count("tr.search-hit"))
	search(b.status(t, other).PendingMessageID)
	require.Contains(t, c.text("#search-results"), "message id")
	require.Contains(t, c.text("#search-results"), "other-3")
	c.run(chromedp.Click("#search-results a", chromedp.ByQuery))
	c.waitRoute("#/saga/")
	require.Equal(t, other, c.text("#saga-id"))

	// Parked: filter by reason, preview a bulk replay, run it.
	c.open("#/parked", "tr.parked-row")
	require.Equal(t, 2, c.count("tr.parked-row"))
	c.run(chromedp.SendKeys("#p-reason", "BUG 17", chromedp.ByQuery), chromedp.Click("#p-apply", chromedp.ByQuery))
	c.waitRoute("reason=")
	require.Equal(t, 1, c.count("tr.parked-row"))
	require.Equal(t, itoa(fold), c.attr("tr.parked-row", "data-id"))
	c.run(chromedp.Click("#bulk-replay", chromedp.ByQuery), chromedp.WaitVisible("#bulk-reason", chromedp.ByQuery),
		chromedp.SendKeys("#bulk-reason", "bug 17 fixed in v1.2.3", chromedp.ByQuery),
		chromedp.Click("#bulk-preview-button", chromedp.ByQuery), chromedp.WaitVisible("#bulk-table", chromedp.ByQuery))
	preview := c.text("#bulk-table")
	containsAll(t, preview, itoa(fold), "would replay", "the saga waits for it in RESERVE_INVENTORY")
	require.Equal(t, 1, c.count("tr.bulk-item"), "only what the filter selects")
	var replayed int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM saga_parked WHERE replayed_at IS NOT NULL`).Scan(&replayed))
	require.Zero(t, replayed, "a preview changes nothing")
	c.run(chromedp.Click("#bulk-run", chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "Replays 1 parked message(s)")
	c.confirm("bug 17 fixed in v1.2.3")
	c.run(chromedp.WaitVisible("#bulk-done", chromedp.ByQuery))
	require.Contains(t, c.text("#bulk-done"), "replayed 1")
	var by, why string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT replayed_by, replay_reason FROM saga_parked WHERE id = $1`, fold).Scan(&by, &why))
	require.Equal(t, "alice", by)
	require.Equal(t, "bug 17 fixed in v1.2.3", why)
}

// TestConsoleUnderstand: a saga's page puts its definition beside its
// timeline (stacked on a narrow screen) with the current step highlighted;
// the diagram hides the operator's arrows until asked; the parked copies
// say which is current and which superseded; times switch between UTC and
// local time and say how long ago; live refresh shows a change without a
// click; the operator log lists actions across sagas.
func TestConsoleUnderstand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, superseded, current := b.supersededAndCurrent(t, "understand-1")
	other := b.start(t, "understand-2")
	postJSON[admin.ActionResult](t, b, "/api/sagas/"+other+"/cancel",
		admin.ActionRequest{ExpectedVersion: 1, Reason: "customer withdrew"}, http.StatusOK)

	c := openConsole(t, b, readToken)
	c.open("#/saga/"+id, "#saga-id")
	var layout struct{ StoryRight, DefLeft, StoryBottom, DefTop float64 }
	const measure = `(() => { const s = document.getElementById("story").getBoundingClientRect(), d = document.getElementById("definition").getBoundingClientRect();
		return {StoryRight: s.right, DefLeft: d.left, StoryBottom: s.bottom, DefTop: d.top}; })()`
	c.eval(measure, &layout)
	require.LessOrEqual(t, layout.StoryRight, layout.DefLeft, "at 1400 px the definition is beside the timeline")
	require.Equal(t, "ScheduleShipping", c.attr("#steps tr.current", "data-step"), "the current step is highlighted")
	require.Equal(t, "SCHEDULE_SHIPPING", c.text("#states li.current"))

	// The diagram: the operator's arrows on demand.
	c.run(chromedp.WaitVisible("#diagram svg g.state.current", chromedp.ByQuery))
	require.Positive(t, c.count("#diagram g.operator-edge"))
	require.Zero(t, c.visibleCount("#diagram g.operator-edge"), "hidden at first")
	require.Zero(t, c.visibleCount("#diagram text.operator-line"))
	c.run(chromedp.Click("#show-operator", chromedp.ByQuery))
	require.Equal(t, c.count("#diagram g.operator-edge"), c.visibleCount("#diagram g.operator-edge"), "shown when asked")
	require.Zero(t, c.count("#diagram script, #diagram foreignObject"))

	// Which parked copy is current, which superseded.
	var standings map[string]string
	c.eval(`Object.fromEntries([...document.querySelectorAll("#saga-parked tr.saga-parked")].map((r) => [r.dataset.id, r.dataset.standing]))`, &standings)
	require.Equal(t, map[string]string{itoa(superseded): "superseded", itoa(current): "current"}, standings)
	require.Contains(t, c.text("#saga-parked"), "no longer waits for this command")
	require.Contains(t, c.text("#saga-parked"), "read-only", "a read token repairs nothing")

	// UTC and local time, and how long ago.
	created := c.text("#facts time")
	require.Contains(t, created, "UTC")
	require.Regexp(t, `^(just now|\d+ (s|min|h|d) ago|in \d+ (s|min|h|d)) · `, created, "how long ago, then when")
	c.run(chromedp.Click("#tz-toggle", chromedp.ByQuery))
	c.waitFor(`document.querySelector("#facts time") && document.querySelector("#facts time").textContent.includes("local")`)
	require.Equal(t, "Local time", c.text("#tz-toggle"))
	c.run(chromedp.Click("#tz-toggle", chromedp.ByQuery))
	c.waitFor(`document.querySelector("#facts time").textContent.includes("UTC")`)

	// Narrow: stacked.
	c.setViewport(1024, 768)
	c.eval(measure, &layout)
	require.GreaterOrEqual(t, layout.DefTop, layout.StoryBottom-1, "at 1024 px the definition is under the timeline")
	c.setViewport(1400, 1000)

	// Live refresh: the shipping reply arrives; the page shows it without a
	// click.
	c.run(chromedp.Click("#live", chromedp.ByQuery))
	b.reply(t, id, &shippingv1.ShippingScheduled{OrderId: "understand-1", TrackingId: "T-1"})
	c.waitFor(`document.getElementById("saga-state").textContent === "APPROVE_ORDER"`)
	c.run(chromedp.Click("#live", chromedp.ByQuery))

	// The operator log.
	c.open("#/log", "tr.log-row")
	log := c.text("#log-rows")
	containsAll(t, log, "alice", "cancel", "understand-2", "customer withdrew", "RESERVE_INVENTORY → CANCELLED")
}

// TestConsoleRepairsSafely: only the repairs the state machine allows are
// offered; each asks for a confirmation that names its effect; Enter in
// the reason runs nothing; going back runs nothing; the button does. The
// superseded parked copies of a saga are dismissed together, audited, and
// the current one replayed.
func TestConsoleRepairsSafely(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := b.complete(t, "safe-done")
	review := b.manualReview(t, "safe-review")
	id, superseded, current := b.supersededAndCurrent(t, "safe-parked")
	waiting := b.start(t, "safe-waiting") // last: no clock move times it out

	c := openConsole(t, b, repairToken)
	c.open("#/saga/"+done, "#actions")
	require.Zero(t, c.count("#actions button"), "a completed saga offers no repair")
	require.Contains(t, c.text("#no-repairs"), "No repair applies in state COMPLETED")

	c.open("#/saga/"+review, "#act-retry")
	require.Equal(t, []string{"act-retry", "act-compensate", "act-cancel", "act-resolve-completed", "act-resolve-failed", "act-resolve-cancelled"}, c.ids("#actions button"))

	c.open("#/saga/"+waiting, "#act-retry")
	require.Equal(t, []string{"act-retry", "act-compensate", "act-cancel"}, c.ids("#actions button"), "no resolve outside manual review")

	// Cancel asks first, naming its effect; Enter in the reason does not
	// run it; Back runs nothing.
	c.run(chromedp.Click("#act-cancel", chromedp.ByQuery))
	effect := c.confirmOpen()
	containsAll(t, effect, "Cancel ends the saga as CANCELLED without compensating")
	require.True(t, c.disabled("#confirm-ok"), "no reason, no button")
	c.run(chromedp.SendKeys("#confirm-reason", "customer withdrew\r", chromedp.ByQuery))
	time.Sleep(500 * time.Millisecond) // what a wrongly wired Enter would have had time to do
	require.True(t, c.dialogOpen(), "Enter does not confirm")
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, waiting).State)
	require.False(t, c.disabled("#confirm-ok"))
	c.run(chromedp.Click("#confirm-cancel", chromedp.ByQuery))
	c.waitFor(`!document.getElementById("confirm").open`)
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, waiting).State, "going back runs nothing")
	require.Len(t, b.audit(t, waiting), 1)

	// Retry, confirmed with the button.
	c.run(chromedp.Click("#act-retry", chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "sends ReserveInventory and the saga stays in RESERVE_INVENTORY")
	c.confirm("inventory service back")
	// The answer shows for a moment, then the page reloads: wait for the
	// saga instead.
	require.Eventually(t, func() bool {
		st, err := b.engine.Status(t.Context(), waiting)
		return err == nil && st.Version == 2
	}, 30*time.Second, 50*time.Millisecond)
	a := b.lastAudit(t, waiting)
	require.Equal(t, "operator.retry", a.Trigger)
	require.Equal(t, "alice", a.Operator)
	require.Contains(t, a.Note, "inventory service back")

	// The parked copies: dismiss the superseded one, replay the current one.
	c.open("#/saga/"+id, "#dismiss-superseded")
	c.run(chromedp.Click("#dismiss-superseded", chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "#"+itoa(superseded))
	c.confirm("superseded by the timeout's resend")
	c.waitFor(`document.querySelectorAll("#saga-parked tr.saga-parked").length === 1`)
	var by, why string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT dismissed_by, dismiss_reason FROM saga_parked WHERE id = $1`, superseded).Scan(&by, &why))
	require.Equal(t, "alice", by)
	require.Equal(t, "superseded by the timeout's resend", why)
	require.Equal(t, admin.TriggerDismiss, b.lastAudit(t, id).Trigger)

	c.run(chromedp.Click(`#saga-parked button.replay-button[data-id="`+itoa(current)+`"]`, chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "the saga still waits for the reply to this command")
	c.confirm("carrier for IS added")
	c.waitFor(`!document.querySelector("#saga-parked")`)
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT replayed_by FROM saga_parked WHERE id = $1`, current).Scan(&by))
	require.Equal(t, "alice", by)
	require.Equal(t, 1, b.outboxOf(t, b.status(t, id).PendingMessageID).Count, "back in the outbox with its own message id")
}

// TestConsoleTimelineInBrowser: the timeline's story, its redaction, the
// type page's diagram, and a cut timeline's warning.
func TestConsoleTimelineInBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-browser")
	b.park(t, b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-browser"}), "order.saga.place_order", "fold failed: inventory reply rejected")

	c := openConsole(t, b, repairToken)
	c.open("#/parked", "tr.parked-row")
	parked := c.text("#parked-rows")
	containsAll(t, parked, "fold failed: inventory reply rejected", "order-browser", "ReserveInventory", "current")
	c.run(chromedp.Click("tr.parked-row td:nth-child(3) a", chromedp.ByQuery))
	c.waitRoute("#/saga/")
	require.Contains(t, c.text("#position-summary"), "step ReserveInventory (compensatable) waits for the reply to ReserveInventory")
	events := c.text("#events")
	containsAll(t, events, "sent ReserveInventory", "parked InventoryReserved")
	var page string
	c.run(chromedp.OuterHTML("body", &page, chromedp.ByQuery))
	require.Contains(t, page, "[REDACTED]")
	require.NotContains(t, page, cardToken, "sensitive fields never reach the browser")
	require.NotContains(t, page, "[object ", "every value renders as text, never as a stringified DOM node")
	require.Contains(t, page, "<dt>Business key</dt>")
	require.Equal(t, 9, c.count("#diagram svg g.state"), "every state of Place Order drawn")
	require.Equal(t, "RESERVE_INVENTORY", c.attr("#diagram svg g.state.current", "data-state"))
	var folded bool
	c.eval(`!document.querySelector("#mermaid").closest("details").open`, &folded)
	require.True(t, folded, "the Mermaid source stays, folded")

	c.run(chromedp.Click("#definition h3 a", chromedp.ByQuery))
	c.waitRoute("#/types/")
	c.run(chromedp.WaitVisible("#diagram svg g.state", chromedp.ByQuery))
	require.Equal(t, "shop.order.v1.PlaceOrder", c.text("#type-name"))
	require.Zero(t, c.count("#diagram svg g.state.current"), "no saga, no highlight")

	_, err := b.pool.Exec(t.Context(), `INSERT INTO saga_audit (saga_id, saga_type, from_state, to_state, trigger, class, version)
SELECT $1::uuid, 'shop.order.v1.PlaceOrder', 'RESERVE_INVENTORY', 'RESERVE_INVENTORY', 'operator.note', 'new', 1 FROM generate_series(1, 1001)`, id)
	require.NoError(t, err)
	c.open("#/saga/"+id, "#timeline-truncated")
	require.Contains(t, c.text("#timeline-truncated"), "only the newest 1000 of each are shown")
}

// TestConsoleScreenshots renders every view at 1400×1000 and 1024×768,
// checks that nothing sticks out sideways (the parked table's last columns
// included), and keeps a screenshot of each (go test -artifacts).
func TestConsoleScreenshots(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _, _ := b.supersededAndCurrent(t, "shot-2026-000042")
	b.manualReview(t, "shot-review")
	for i := range 3 {
		b.complete(t, "shot-done-"+itoa(int64(i)))
	}
	b.clock.Advance(time.Minute)
	stuck := b.start(t, "shot-stuck")
	b.clock.Advance(5 * time.Minute)
	b.park(t, b.replyEnvelope(t, stuck, &inventoryv1.InventoryReserved{OrderId: "shot-stuck"}), "order.saga.place_order",
		"handler: saga handle: fold shop.inventory.v1.InventoryReserved into shop.order.v1.PlaceOrderData: "+strings.Repeat("a long, wrapped reason; ", 8))
	b.park(t, b.replyEnvelope(t, stuck, &paymentv1.PaymentAuthorized{OrderId: "shot-stuck"}), "a.very.long.queue.name.of.another.service.saga.place_order_with_suffix", "unknown message type")
	postJSON[admin.ActionResult](t, b, "/api/sagas/"+stuck+"/retry", admin.ActionRequest{ExpectedVersion: 1, Reason: "screenshot"}, http.StatusOK)

	c := openConsole(t, b, repairToken)
	views := []struct {
		name, hash, wait string
		then             []chromedp.Action
	}{
		{"sagas", "#/sagas", "tr.saga-row", nil},
		{"stuck", "#/sagas?stuck=true", "tr.saga-row", nil},
		{"review", "#/sagas?review=true", "tr.saga-row", nil},
		{"sagas-bulk-preview", "#/sagas?review=true", "#bulk-repair", []chromedp.Action{
			chromedp.Click("#bulk-repair", chromedp.ByQuery), chromedp.SendKeys("#bulk-reason", "provider back", chromedp.ByQuery),
			chromedp.Click("#bulk-preview-button", chromedp.ByQuery), chromedp.WaitVisible("#bulk-table", chromedp.ByQuery)}},
		{"saga", "#/saga/" + id, "#diagram svg", nil},
		{"saga-operator-arrows", "#/saga/" + id, "#diagram svg", []chromedp.Action{chromedp.Click("#show-operator", chromedp.ByQuery)}},
		{"confirm", "#/saga/" + id, "#act-cancel", []chromedp.Action{chromedp.Click("#act-cancel", chromedp.ByQuery), chromedp.WaitVisible("#confirm-effect", chromedp.ByQuery)}},
		{"parked", "#/parked", "tr.parked-row", nil},
		{"parked-bulk-preview", "#/parked?queue=shipping.commands", "#bulk-dismiss", []chromedp.Action{
			chromedp.Click("#bulk-dismiss", chromedp.ByQuery), chromedp.SendKeys("#bulk-reason", "tidy up", chromedp.ByQuery),
			chromedp.Click("#bulk-preview-button", chromedp.ByQuery), chromedp.WaitVisible("#bulk-table", chromedp.ByQuery)}},
		{"search", "#/search?q=shot-", "tr.search-hit", nil},
		{"operator-log", "#/log", "tr.log-row", nil},
		{"types", "#/types", "#types li", nil},
		{"type", "#/types/shop.order.v1.PlaceOrder", "#diagram svg", nil},
	}
	for _, size := range [][2]int{{1400, 1000}, {1024, 768}} {
		c.setViewport(size[0], size[1])
		for _, v := range views {
			name := fmt.Sprintf("%s-%dx%d", v.name, size[0], size[1])
			c.open(v.hash, v.wait)
			if len(v.then) > 0 {
				c.run(v.then...)
			}
			c.noOverflow(name)
			c.screenshot(name, size[0])
			if c.dialogOpen() {
				c.run(chromedp.Click("#confirm-cancel", chromedp.ByQuery))
			}
		}
		if size[0] == 1400 {
			// The parked table's last columns stay on screen.
			var right, width float64
			c.open("#/parked", "tr.parked-row")
			c.eval(`document.querySelector("#parked-table th:last-child").getBoundingClientRect().right`, &right)
			c.eval(`document.documentElement.clientWidth`, &width)
			require.LessOrEqual(t, right, width)
		}
	}
	// And the sign-in page.
	ctx := browsertest.New(t)
	s := &console{t: t, ctx: ctx, b: b}
	for _, size := range [][2]int{{1400, 1000}, {1024, 768}} {
		s.setViewport(size[0], size[1])
		s.open("", "#token")
		name := fmt.Sprintf("sign-in-%dx%d", size[0], size[1])
		s.noOverflow(name)
		s.screenshot(name, size[0])
	}
}

// TestConsoleLinksAndPreviews: a bulk repair's preview names the one state
// each saga would reach and what it would send, then runs; a saga repaired
// and completed shows no old error; a reply parked without saga metadata
// is shown under the saga its correlation field names, and replaying it is
// checked against that saga and audited in its trail.
func TestConsoleLinksAndPreviews(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reviews := []string{b.manualReview(t, "preview-1"), b.manualReview(t, "preview-2")}
	done := b.manualReview(t, "preview-done")
	postJSON[admin.ActionResult](t, b, "/api/sagas/"+done+"/retry",
		admin.ActionRequest{ExpectedVersion: b.status(t, done).Version, Reason: "provider back"}, http.StatusOK)
	b.reply(t, done, &paymentv1.PaymentAuthorized{OrderId: "preview-done", AuthorizationId: "a-1"})
	b.reply(t, done, &shippingv1.ShippingScheduled{OrderId: "preview-done", TrackingId: "T-1"})
	b.reply(t, done, &orderv1.OrderApproved{OrderId: "preview-done"})
	require.NotEmpty(t, b.status(t, done).LastError, "the engine keeps the error the saga got past")
	unlinked := b.start(t, "preview-unlinked")
	reply := &inventoryv1.InventoryReserved{OrderId: "preview-unlinked"}
	env, err := message.New(reply, message.Meta{CausationID: b.status(t, unlinked).PendingMessageID})
	require.NoError(t, err)
	pid := b.park(t, env, "order.saga.place_order", "fold failed: bug 18")

	c := openConsole(t, b, repairToken)

	// The bulk preview: where each saga goes, not every state a retry may
	// lead to.
	c.open("#/sagas?review=true", "tr.saga-row")
	c.run(chromedp.Click("#bulk-repair", chromedp.ByQuery), chromedp.WaitVisible("#bulk-reason", chromedp.ByQuery),
		chromedp.SendKeys("#bulk-reason", "payment provider back", chromedp.ByQuery),
		chromedp.Click("#bulk-preview-button", chromedp.ByQuery), chromedp.WaitVisible("#bulk-table", chromedp.ByQuery))
	var reaches []string
	c.eval(`[...document.querySelectorAll("#bulk-table td.bulk-to")].map((td) => td.textContent)`, &reaches)
	require.Equal(t, []string{"AUTHORIZE_PAYMENT", "AUTHORIZE_PAYMENT"}, reaches)
	require.Contains(t, c.text("#bulk-table"), "sends AuthorizePayment and the saga goes to AUTHORIZE_PAYMENT")
	for _, id := range reviews {
		require.Equal(t, "MANUAL_REVIEW", b.status(t, id).State, "a preview changes nothing")
	}
	c.run(chromedp.Click("#bulk-run", chromedp.ByQuery))
	c.confirm("payment provider back")
	c.run(chromedp.WaitVisible("#bulk-done", chromedp.ByQuery))
	require.Contains(t, c.text("#bulk-done"), "applied 2")
	for _, id := range reviews {
		require.Equal(t, "AUTHORIZE_PAYMENT", b.status(t, id).State)
	}

	// A completed saga shows no old error, in the list and on its page.
	c.open("#/sagas?key_prefix=preview-done", `tr.saga-row[data-id="`+done+`"]`)
	var attention string
	c.eval(`document.querySelector('tr.saga-row[data-id="`+done+`"] td.reason').textContent`, &attention)
	require.Empty(t, attention, "no old error")
	c.open("#/saga/"+done, "#facts")
	require.NotContains(t, c.text("#facts"), "Last error")

	// The parked reply without saga metadata, joined to its saga.
	c.open("#/parked", `tr.parked-row[data-id="`+itoa(pid)+`"]`)
	row := c.text(`tr.parked-row[data-id="` + itoa(pid) + `"]`)
	containsAll(t, row, unlinked, "preview-unlinked", "linked by correlation", "current")
	c.run(chromedp.Click(`tr.parked-row[data-id="`+itoa(pid)+`"] button.replay-button`, chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "the saga waits for it in RESERVE_INVENTORY")
	c.confirm("bug 18 fixed")
	require.Eventually(t, func() bool {
		h, err := b.engine.History(t.Context(), unlinked)
		return err == nil && h[len(h)-1].Trigger == admin.TriggerReplay
	}, 30*time.Second, 50*time.Millisecond)
	note := b.lastAudit(t, unlinked)
	require.Equal(t, admin.TriggerReplay, note.Trigger, "audited in the saga's trail")
	require.Contains(t, note.Note, "bug 18 fixed")
}

// TestConsoleCallbacks: a saga's page lists its HTTP callbacks with their
// status, and a parked one is replayed from it (confirmed with a reason,
// audited); a read-only operator sees them without the button.
func TestConsoleCallbacks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "console-callbacks")
	pending := b.enqueueCallback(t, id, "https://client.example/orders/console-callbacks")
	parked := b.enqueueCallback(t, id, "ftp://client.example/orders/console-callbacks")

	ro := openConsole(t, b, readToken)
	ro.open("#/saga/"+id, "#saga-callbacks")
	require.Equal(t, 2, ro.count("#saga-callbacks tr.saga-callback"))
	require.Zero(t, ro.count("#saga-callbacks button"), "read-only: no replay")

	c := openConsole(t, b, repairToken)
	c.open("#/saga/"+id, "#saga-callbacks")
	require.Contains(t, c.text(`#saga-callbacks tr[data-id="`+pending+`"]`), "pending")
	row := c.text(`#saga-callbacks tr[data-id="` + parked + `"]`)
	containsAll(t, row, "saga.completed", "parked", "want an absolute http or https URL")
	require.Equal(t, 1, c.count("#saga-callbacks button.callback-replay"))

	c.run(chromedp.Click(`#saga-callbacks button.callback-replay[data-id="`+parked+`"]`, chromedp.ByQuery))
	require.Contains(t, c.confirmOpen(), "keeps its id, so a receiver that did process it deduplicates")
	c.confirm("client moved to https")
	require.Eventually(t, func() bool {
		audit, err := callback.Audit(t.Context(), b.pool, parked)
		return err == nil && len(audit) == 1
	}, 30*time.Second, 50*time.Millisecond)
	audit, err := callback.Audit(t.Context(), b.pool, parked)
	require.NoError(t, err)
	require.Equal(t, "alice", audit[0].Operator)
	require.Equal(t, "client moved to https", audit[0].Reason)
}
