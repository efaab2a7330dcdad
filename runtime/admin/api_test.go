package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/telemetry"
)

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-auth")
	reads := []string{"/api/whoami", "/api/types", "/api/types/shop.order.v1.PlaceOrder/diagram.svg", "/api/sagas", "/api/sagas/" + id, "/api/parked", "/api/parked/1", "/api/nope"}
	repairs := []string{"/api/sagas/" + id + "/cancel", "/api/bulk/sagas/cancel", "/api/parked/1/replay", "/api/bulk/parked/replay"}

	for _, p := range append(reads, repairs...) {
		method := http.MethodGet
		if strings.HasSuffix(p, "cancel") || strings.HasSuffix(p, "replay") {
			method = http.MethodPost
		}
		for _, tok := range []string{"", "wrong-token-0123456789abcdef", strings.ToUpper(repairToken)} {
			code, raw := b.call(t, tok, method, p, `{"reason":"x","expected_version":1}`)
			require.Equal(t, http.StatusUnauthorized, code, "%s %s with %q: %s", method, p, tok, raw)
			require.Equal(t, "unauthenticated", apiError(t, raw).Code)
		}
	}
	// A read token reaches every read endpoint but no repair.
	for _, p := range reads {
		code, raw := b.call(t, readToken, http.MethodGet, p, nil)
		require.NotEqual(t, http.StatusUnauthorized, code, p)
		require.NotEqual(t, http.StatusForbidden, code, "%s: %s", p, raw)
	}
	for _, p := range repairs {
		code, raw := b.call(t, readToken, http.MethodPost, p, `{"reason":"x","expected_version":1}`)
		require.Equal(t, http.StatusForbidden, code, "%s: %s", p, raw)
		e := apiError(t, raw)
		require.Equal(t, "forbidden", e.Code)
		require.Contains(t, e.Message, "viewer has role read")
	}
	require.Equal(t, "RESERVE_INVENTORY", b.status(t, id).State, "a refused call changed nothing")

	who := getJSON[admin.WhoAmI](t, b, "/api/whoami")
	require.Equal(t, admin.Principal{Name: "alice", Role: admin.RoleRepair}, who.Principal)

	// The console's static files need no token, and carry a strict CSP.
	for _, p := range []string{"/", "/console.js", "/console.css"} {
		res, err := b.http.Client().Get(b.http.URL + p)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, p)
		require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
	}
	res, err := b.http.Client().Get(b.http.URL + "/secret.txt")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

// TestFailedSignIns: a request with an unknown token is logged (never the
// token) and counted per client address; past the limit in a window, the
// address is refused every request, a valid token included, until the
// window ends. Requests without a token are logged, not counted.
func TestFailedSignIns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &testenv.LogBuffer{}
	srv, err := admin.New(admin.Config{Pool: b.pool, Sagas: []*saga.Engine{b.engine}, Tokens: tokens, Now: b.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), MaxFailedSignIns: 3, SignInWindow: time.Minute})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	call := func(tok string) (int, http.Header) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, hs.URL+"/api/whoami", nil)
		require.NoError(t, err)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := hs.Client().Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode, res.Header
	}
	const guess = "guess-0123456789abcdef-guess"
	code, _ := call("")
	require.Equal(t, http.StatusUnauthorized, code)
	for range 3 {
		code, _ = call(guess)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	code, h := call(repairToken)
	require.Equal(t, http.StatusTooManyRequests, code, "locked out: not even a valid token is checked")
	require.Equal(t, "61", h.Get("Retry-After"))
	code, _ = call(guess)
	require.Equal(t, http.StatusTooManyRequests, code)

	failed := logs.Records(t, "admin sign-in failed")
	require.Len(t, failed, 4)
	require.Equal(t, "no bearer token", failed[0]["reason"])
	require.Equal(t, "unknown token", failed[1]["reason"])
	require.Equal(t, "127.0.0.1", failed[1]["client"])
	require.EqualValues(t, 3, failed[3]["failures"])
	require.Len(t, logs.Records(t, "admin sign-ins refused: too many failed"), 1, "logged once per window")
	require.NotContains(t, logs.String(), guess)
	require.NotContains(t, logs.String(), repairToken)

	b.clock.Advance(time.Minute) // the window ends
	code, _ = call(repairToken)
	require.Equal(t, http.StatusOK, code)
}

// TestTokensReplaced: SetTokens rotates the tokens of a running server;
// invalid ones are refused and the current ones kept.
func TestTokensReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const next = "next-token-0123456789abcdef"
	require.NoError(t, b.server.SetTokens(admin.Tokens{next: {Name: "bob", Role: admin.RoleRead}}))
	code, _ := b.call(t, repairToken, http.MethodGet, "/api/whoami", nil)
	require.Equal(t, http.StatusUnauthorized, code, "the old token no longer works")
	code, raw := b.call(t, next, http.MethodGet, "/api/whoami", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(raw), `"bob"`)
	require.ErrorContains(t, b.server.SetTokens(admin.Tokens{"short": {Name: "x", Role: admin.RoleRead}}), "shorter than 16")
	code, _ = b.call(t, next, http.MethodGet, "/api/whoami", nil)
	require.Equal(t, http.StatusOK, code, "a refused reload keeps the tokens")
	require.NotContains(t, b.logs.String(), next)
	require.Len(t, b.logs.Records(t, "admin tokens replaced"), 1)
}

func TestTokens(t *testing.T) {
	t.Parallel()
	tk, err := admin.ParseTokens("alice:repair:0123456789abcdef0123, dash:read:abcdefabcdefabcdef:with:colons")
	require.NoError(t, err)
	require.Equal(t, admin.Principal{Name: "alice", Role: admin.RoleRepair}, tk["0123456789abcdef0123"])
	require.Equal(t, admin.Principal{Name: "dash", Role: admin.RoleRead}, tk["abcdefabcdefabcdef:with:colons"])
	require.NotContains(t, tk.String(), "0123456789abcdef")

	for spec, want := range map[string]string{
		"":                              "no tokens",
		"alice:repair":                  "want name:role:token",
		"alice:admin:0123456789abcdef0": `role "admin"`,
		"alice:read:short":              "shorter than 16",
		"al ice:read:0123456789abcdef0": "want name:role:token",
		"-x:read:0123456789abcdef0":     "principal name",
		"a:read:0123456789abcdef0,b:repair:0123456789abcdef0": "listed twice",
	} {
		_, err := admin.ParseTokens(spec)
		require.ErrorContains(t, err, want, spec)
		require.NotContains(t, err.Error(), "0123456789abcdef0", "errors never quote tokens")
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-validate")
	missing := newID()
	cases := []struct {
		method, path string
		body         any
		code         int
		msg          string
	}{
		{"GET", "/api/sagas?limit=0", nil, 400, "limit=\"0\": want a whole number from 1 to 200"},
		{"GET", "/api/sagas?limit=201", nil, 400, "from 1 to 200"},
		{"GET", "/api/sagas?limit=ten", nil, 400, "limit"},
		{"GET", "/api/sagas?type=shop.Nope", nil, 400, `unknown saga type "shop.Nope" (served: shop.order.v1.PlaceOrder)`},
		{"GET", "/api/sagas?state=reserve", nil, 400, "upper-case state name"},
		{"GET", "/api/sagas?state=SHIPPED", nil, 400, `state "SHIPPED" is not a state of shop.order.v1.PlaceOrder`},
		{"GET", "/api/sagas?stuck=maybe", nil, 400, `stuck="maybe": want true or false`},
		{"GET", "/api/sagas?stuck=true&review=true", nil, 400, "exclude each other"},
		{"GET", "/api/sagas?review=true&state=COMPLETED", nil, 400, "contradicts"},
		{"GET", "/api/sagas?cursor=%25%25", nil, 400, "not a cursor"},
		{"GET", "/api/sagas?cursor=bm9wZQ", nil, 400, "not a cursor"},
		{"GET", "/api/sagas?colour=red", nil, 400, `unknown query parameter "colour"`},
		{"GET", "/api/sagas?type=a&type=b", nil, 400, "given 2 times"},
		{"GET", "/api/sagas/not-a-uuid", nil, 400, `saga id "not-a-uuid" is not a UUID`},
		{"GET", "/api/sagas/" + missing, nil, 404, "no saga " + missing},
		{"GET", "/api/parked/abc", nil, 400, "want a positive whole number"},
		{"GET", "/api/parked/0", nil, 400, "want a positive whole number"},
		{"GET", "/api/parked/99999999", nil, 404, "no parked message 99999999"},
		{"GET", "/api/parked?saga_id=xyz", nil, 400, "not a UUID"},
		{"GET", "/api/parked?cursor=-3", nil, 400, "not a cursor"},
		{"GET", "/api/sagas?business_key=%FF", nil, 400, "business_key: not valid UTF-8"},
		{"GET", "/api/sagas?business_key=a%00b", nil, 400, "business_key: contains NUL"},
		{"GET", "/api/parked?queue=%FF", nil, 400, "queue: not valid UTF-8"},
		{"GET", "/api/parked?queue=a%00b", nil, 400, "queue: contains NUL"},
		{"GET", "/api/parked?saga_type=%C3", nil, 400, "saga_type: not valid UTF-8"},
		{"GET", "/api/parked?message_type=x%00", nil, 400, "message_type: contains NUL"},
		{"POST", "/api/bulk/sagas/cancel", `{"reason":"x","dry_run":true,"filter":{"business_key":"a\u0000"}}`, 400, "business_key: contains NUL"},
		{"POST", "/api/bulk/parked/replay", `{"reason":"x","dry_run":true,"filter":{"queue":"a\u0000"}}`, 400, "queue: contains NUL"},
		{"POST", "/api/bulk/parked/replay", `{"reason":"x","dry_run":true,"filter":{"message_type":"\u0000"}}`, 400, "message_type: contains NUL"},
		{"POST", "/api/sagas/" + id + "/retry", "", 400, "request body is empty"},
		{"POST", "/api/sagas/" + id + "/retry", "{", 400, "invalid JSON body"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "x", "expected_version": 1, "force": true}, 400, `unknown field "force"`},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"expected_version": 1}, 400, "reason is required"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "   ", "expected_version": 1}, 400, "reason is required"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": strings.Repeat("x", 1001), "expected_version": 1}, 400, "at most 1000"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "x"}, 400, "expected_version is required"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "x", "expected_version": -1}, 400, "expected_version=-1: versions start at 1"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "a\x1b[2Jb", "expected_version": 1}, 400, "control characters"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "a\x7fb", "expected_version": 1}, 400, "control characters"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "a\u009bb", "expected_version": 1}, 400, "control characters"},
		{"POST", "/api/sagas/" + id + "/retry", map[string]any{"reason": "a\u2028b", "expected_version": 1}, 400, "control characters"},
		{"POST", "/api/parked/1/replay", map[string]any{"reason": "line\u2029break"}, 400, "control characters"},
		{"POST", "/api/sagas/" + id + "/cancel", map[string]any{"reason": "x", "expected_version": 1, "to": "COMPLETED"}, 400, "only for resolve"},
		{"POST", "/api/sagas/" + id + "/resolve", map[string]any{"reason": "x", "expected_version": 1, "to": "RESERVE_INVENTORY"}, 400, "resolve needs \"to\""},
		{"POST", "/api/sagas/" + id + "/explode", map[string]any{"reason": "x", "expected_version": 1}, 404, `unknown action "explode"`},
		{"POST", "/api/sagas/" + missing + "/cancel", map[string]any{"reason": "x", "expected_version": 1}, 404, "no saga"},
		{"POST", "/api/bulk/sagas/cancel", map[string]any{"reason": "x"}, 400, "name at least one"},
		{"POST", "/api/bulk/sagas/cancel", map[string]any{"reason": "x", "max": 501, "filter": map[string]any{"stuck": true}}, 400, "max=501"},
		{"POST", "/api/bulk/parked/replay", map[string]any{"reason": "x"}, 400, "name at least one"},
		{"POST", "/api/parked/1/replay", map[string]any{}, 400, "reason is required"},
		{"POST", "/api/parked/1/replay", strings.Repeat(" ", 70<<10) + "{}", 413, "over"},
		{"GET", "/api/frobnicate", nil, 404, "no such API endpoint"},
		{"PUT", "/api/sagas", nil, 405, "/api/sagas takes GET, HEAD only"},
		{"DELETE", "/api/sagas/" + id, nil, 405, "/api/sagas/{id} takes GET, HEAD only"},
		{"GET", "/api/sagas/" + id + "/cancel", nil, 405, "takes POST only"},
		{"DELETE", "/api/parked/1", nil, 405, "takes GET, HEAD only"},
		{"PUT", "/api/bulk/parked/replay", nil, 405, "takes POST only"},
		{"POST", "/api/whoami", nil, 405, "takes GET, HEAD only"},
	}
	for _, c := range cases {
		code, raw := b.call(t, repairToken, c.method, c.path, c.body)
		require.Equal(t, c.code, code, "%s %s: %s", c.method, c.path, raw)
		e := apiError(t, raw)
		require.Contains(t, e.Message, c.msg, "%s %s", c.method, c.path)
		if code == http.StatusMethodNotAllowed {
			require.Equal(t, "method_not_allowed", e.Code)
		}
	}
	code, raw := b.call(t, "", http.MethodPut, "/api/sagas", nil)
	require.Equal(t, http.StatusUnauthorized, code, "a wrong method still needs a token first: %s", raw)
	require.Equal(t, int64(1), b.status(t, id).Version, "no invalid request changed the saga")
}

func TestListSagas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	review := b.manualReview(t, "order-review")
	old := b.start(t, "order-old") // will be stuck: its 30 s step timeout passes unfired
	b.clock.Advance(45 * time.Second)
	fresh := b.start(t, "order-fresh")
	b.clock.Advance(time.Second)

	page := getJSON[admin.SagaPage](t, b, "/api/sagas")
	require.Len(t, page.Items, 3)
	require.Equal(t, []string{fresh, old, review}, []string{page.Items[0].ID, page.Items[1].ID, page.Items[2].ID}, "newest first")
	require.Empty(t, page.NextCursor)

	// Paging: two pages of two and one, no duplicates.
	p1 := getJSON[admin.SagaPage](t, b, "/api/sagas?limit=2")
	require.Len(t, p1.Items, 2)
	require.NotEmpty(t, p1.NextCursor)
	p2 := getJSON[admin.SagaPage](t, b, "/api/sagas?limit=2&cursor="+p1.NextCursor)
	require.Len(t, p2.Items, 1)
	require.Equal(t, review, p2.Items[0].ID)
	require.Empty(t, p2.NextCursor)

	stuck := getJSON[admin.SagaPage](t, b, "/api/sagas?stuck=true")
	require.Len(t, stuck.Items, 1)
	require.Equal(t, old, stuck.Items[0].ID)
	require.True(t, stuck.Items[0].Stuck)
	require.Contains(t, stuck.Items[0].StuckReason, "timeout due")
	require.Equal(t, "ReserveInventory", stuck.Items[0].Step)

	rv := getJSON[admin.SagaPage](t, b, "/api/sagas?review=true&type=shop.order.v1.PlaceOrder")
	require.Len(t, rv.Items, 1)
	require.Equal(t, review, rv.Items[0].ID)
	require.NotEmpty(t, rv.Items[0].ReviewReason)
	require.Equal(t, "AUTHORIZE_PAYMENT", rv.Items[0].ReviewFrom)
	require.False(t, rv.Items[0].Stuck, "manual review waits for an operator, not a timeout")

	byState := getJSON[admin.SagaPage](t, b, "/api/sagas?state=RESERVE_INVENTORY")
	require.Len(t, byState.Items, 2)
	byKey := getJSON[admin.SagaPage](t, b, "/api/sagas?business_key=order-fresh")
	require.Len(t, byKey.Items, 1)
	require.Equal(t, fresh, byKey.Items[0].ID)

	// No progress beyond the step's SLA also counts when no timeout is armed.
	_, err := b.pool.Exec(t.Context(), `UPDATE saga_place_order SET timeout_at = NULL WHERE id = $1`, fresh)
	require.NoError(t, err)
	b.clock.Advance(40 * time.Second)
	stuck = getJSON[admin.SagaPage](t, b, "/api/sagas?stuck=true")
	require.Len(t, stuck.Items, 2)
	require.Equal(t, fresh, stuck.Items[0].ID)
	require.Contains(t, stuck.Items[0].StuckReason, "no progress for 41s; the step's timeout is 30s")

	types := getJSON[[]admin.SagaType](t, b, "/api/types")
	require.Len(t, types, 1)
	require.Equal(t, "shop.order.v1.PlaceOrder", types[0].Name)
	require.Contains(t, types[0].Mermaid, "stateDiagram-v2")
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-tl")
	first := b.status(t, id).PendingMessageID
	reserved := b.replyEnvelope(t, id, &inventoryv1.InventoryReserved{OrderId: "order-tl"})
	require.NoError(t, b.deliver(t, reserved, &inventoryv1.InventoryReserved{OrderId: "order-tl"}))

	// Waiting on the pivot: where it is, what it waits for, what comes next.
	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.Equal(t, "AUTHORIZE_PAYMENT", tl.Position.State)
	require.Equal(t, "AuthorizePayment", tl.Position.Step)
	require.Equal(t, "pivot", tl.Position.Role)
	require.Equal(t, []string{"shop.payment.v1.PaymentAuthorized", "shop.payment.v1.PaymentAuthorizationFailed"}, tl.Position.WaitingFor)
	require.Equal(t, []string{"ScheduleShipping", "ApproveOrder"}, tl.Position.Remaining)
	require.Equal(t, "retry", tl.Position.OnTimeout)
	require.Equal(t, 3, tl.Position.MaxAttempts)
	require.NotNil(t, tl.Position.TimeoutAt)
	require.Contains(t, tl.Position.Summary, "step AuthorizePayment (pivot) waits for the reply to AuthorizePayment")
	var triggers []string
	for _, n := range tl.Position.Next {
		triggers = append(triggers, n.Trigger)
	}
	require.Contains(t, triggers, "shop.payment.v1.PaymentAuthorized")
	require.Contains(t, triggers, "timeout")

	// A relay published the first command.
	b.markPublished(t, first)

	// Then into manual review through two retries.
	for range 3 {
		b.clock.Advance(2 * time.Minute)
		_, err := b.engine.FireTimeouts(t.Context(), 10)
		require.NoError(t, err)
	}
	payEnv, err := message.New(&paymentv1.PaymentAuthorized{OrderId: "order-tl", AuthorizationId: "auth-1"},
		message.Meta{SagaID: id, SagaType: "shop.order.v1.PlaceOrder", CausationID: b.status(t, id).PendingMessageID})
	require.NoError(t, err)
	parkedID := b.park(t, payEnv, "order.saga.place_order", "handler exploded")

	code, raw := b.call(t, readToken, http.MethodGet, "/api/sagas/"+id, nil)
	require.Equal(t, http.StatusOK, code, string(raw))
	require.NoError(t, json.Unmarshal(raw, &tl))
	require.Equal(t, "MANUAL_REVIEW", tl.Saga.State)
	require.Equal(t, "manual review", tl.Position.Kind)
	require.Equal(t, []string{"operator"}, tl.Position.WaitingFor)
	require.Contains(t, tl.Position.Summary, "came from AUTHORIZE_PAYMENT")
	cur := map[string]admin.StateView{}
	for _, s := range tl.States {
		cur[s.Name] = s
	}
	require.True(t, cur["MANUAL_REVIEW"].Current)
	require.True(t, cur["RESERVE_INVENTORY"].Visited)
	require.False(t, cur["COMPLETED"].Visited)
	require.Contains(t, tl.Mermaid, "stateDiagram-v2")

	// Every transition with its cause; messages in and out; retries; parked.
	var reply, received *admin.Event
	var sent []string
	var parked *admin.Event
	for i, e := range tl.Events {
		switch e.Kind {
		case admin.EventTransition:
			if e.Trigger == "shop.inventory.v1.InventoryReserved" {
				reply = &tl.Events[i]
				require.NotNil(t, received, "the message is listed before the transition it caused")
			}
		case admin.EventMessage:
			if e.Direction == "in" {
				// Delivered with no outbox row in this database: listed
				// from its transition.
				require.Nil(t, received, "listed once")
				received = &tl.Events[i]
				continue
			}
			require.Equal(t, "out", e.Direction)
			sent = append(sent, e.MessageType)
			if e.MessageID == first {
				require.NotNil(t, e.PublishedAt, "the published command shows when")
				require.Equal(t, 1, e.PublishAttempts)
				require.NotContains(t, e.Summary, "not yet published")
			} else {
				require.Nil(t, e.PublishedAt, "%s is not published", e.MessageType)
				require.Contains(t, e.Summary, "not yet published")
			}
		case admin.EventParked:
			parked = &tl.Events[i]
		}
	}
	require.NotNil(t, reply)
	require.Equal(t, reserved.MessageID, reply.MessageID)
	require.Equal(t, reserved.MessageID, received.MessageID)
	require.Equal(t, "shop.inventory.v1.InventoryReserved", received.MessageType)
	require.Equal(t, "received InventoryReserved (sent from outside this database)", received.Summary)
	require.NotNil(t, received.ReceivedAt)
	require.True(t, received.Outside)
	require.True(t, received.ReceivedAt.Equal(reply.At), "received when its transition applied it")
	require.Equal(t, 1, tl.Counts.MessagesIn)
	require.Equal(t, first, reply.CausationID, "the reply's cause is the command it answers")
	require.Equal(t, "RESERVE_INVENTORY", reply.From)
	require.Equal(t, []string{"shop.inventory.v1.ReserveInventory", "shop.payment.v1.AuthorizePayment",
		"shop.payment.v1.AuthorizePayment", "shop.payment.v1.AuthorizePayment"}, sent)
	require.Equal(t, 2, tl.Counts.Retries)
	require.Equal(t, 4, tl.Counts.MessagesOut)
	require.Equal(t, 1, tl.Counts.Parked)
	require.NotNil(t, parked)
	require.Equal(t, parkedID, parked.ParkedID)
	require.Equal(t, "handler exploded", parked.Reason)
	require.Equal(t, "in", parked.Direction)
	require.Contains(t, string(parked.Body.JSON), "auth-1")
	for i := 1; i < len(tl.Events); i++ {
		require.False(t, tl.Events[i].At.Before(tl.Events[i-1].At), "events are in time order")
	}
	// The timeline of an unknown saga type is refused; of the right one, found.
	code, _ = b.call(t, readToken, http.MethodGet, "/api/sagas/"+id+"?type=shop.order.v1.PlaceOrder", nil)
	require.Equal(t, http.StatusOK, code)
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-secret")
	b.reply(t, id, &inventoryv1.InventoryReserved{OrderId: "order-secret"}) // AuthorizePayment (card_token) is sent

	// A parked command with a sensitive field, and a parked message of a type
	// no registry knows.
	cmd, err := message.New(&paymentv1.AuthorizePayment{OrderId: "order-secret", CardToken: cardToken},
		message.Meta{SagaID: id, SagaType: "shop.order.v1.PlaceOrder"})
	require.NoError(t, err)
	cmdParked := b.park(t, cmd, "payment.commands", "card service down")
	unknownInfo := sagatest.NewType("other.v1.Mystery", message.KindEvent)
	unknownInfo.Exchange, unknownInfo.RoutingKey, unknownInfo.SchemaVersion = "other", "event.mystery", 1
	unk, err := message.New(sagatest.NewMessage(unknownInfo, cardToken), message.Meta{})
	require.NoError(t, err)
	unkParked := b.park(t, unk, "other.events", "unknown message type")

	code, raw := b.call(t, readToken, http.MethodGet, "/api/sagas/"+id, nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(raw), cardToken)
	require.NotContains(t, string(raw), street)
	var tl admin.Timeline
	require.NoError(t, json.Unmarshal(raw, &tl))
	require.ElementsMatch(t, []string{"card_token", "shipping_address"}, tl.Data.Redacted)
	var data map[string]any
	require.NoError(t, json.Unmarshal(tl.Data.JSON, &data))
	require.Equal(t, admin.Redacted, data["card_token"])
	require.Equal(t, admin.Redacted, data["shipping_address"])
	require.Equal(t, "order-secret", data["order_id"], "other fields are shown")
	seen := 0
	for _, e := range tl.Events {
		if e.MessageType == "shop.payment.v1.AuthorizePayment" {
			require.Equal(t, []string{"card_token"}, e.Body.Redacted)
			var body map[string]any
			require.NoError(t, json.Unmarshal(e.Body.JSON, &body))
			require.Equal(t, admin.Redacted, body["card_token"])
			require.Equal(t, "order-secret", body["order_id"])
			seen++
		}
	}
	require.Equal(t, 2, seen, "the outbox copy and the parked copy")

	code, raw = b.call(t, readToken, http.MethodGet, "/api/parked/"+itoa(cmdParked), nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(raw), cardToken)
	var p admin.Parked
	require.NoError(t, json.Unmarshal(raw, &p))
	require.Equal(t, "AuthorizePayment", p.Step)
	require.Equal(t, "order-secret", p.BusinessKey)
	require.Equal(t, "AUTHORIZE_PAYMENT", p.SagaState)
	require.Equal(t, []string{"card_token"}, p.Body.Redacted)

	code, raw = b.call(t, readToken, http.MethodGet, "/api/parked/"+itoa(unkParked), nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(raw), cardToken, "a body of an unknown type is shown by size only")
	var u admin.Parked
	require.NoError(t, json.Unmarshal(raw, &u))
	require.Nil(t, u.Body.JSON)
	require.Equal(t, len(unk.Body), u.Body.Size)
	require.Contains(t, u.Body.Note, "unknown")

}

// TestTimelineKeepsTheNewest: a saga with more audit rows, sent messages
// and parked messages than a timeline holds shows the newest of each, and
// says it was cut.
func TestTimelineKeepsTheNewest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-long")
	require.False(t, getJSON[admin.Timeline](t, b, "/api/sagas/"+id).Truncated)

	const n = 1003 // more than the 1000 of each a timeline holds
	_, err := b.pool.Exec(t.Context(), `INSERT INTO saga_audit (saga_id, saga_type, from_state, to_state, trigger, class, note, version)
SELECT $1::uuid, 'shop.order.v1.PlaceOrder', 'RESERVE_INVENTORY', 'RESERVE_INVENTORY', 'operator.note', 'new', 'note-' || i, 1
FROM generate_series(1, $2::int) AS i`, id, n)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, saga_id, body, occurred_at)
SELECT 'out-' || i, 'x', 'k', 'shop.inventory.v1.ReserveInventory', 1, $1, '\x00', now() FROM generate_series(1, $2::int) AS i`, id, n)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO saga_parked (message_id, queue, message_type, saga_id, saga_type, class, reason, attempts, body, first_failure_at)
SELECT 'park-' || i, 'q', 'shop.inventory.v1.InventoryReserved', $1, 'shop.order.v1.PlaceOrder', 'permanent', 'boom', 1, '\x00', now()
FROM generate_series(1, $2::int) AS i`, id, n)
	require.NoError(t, err)

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	require.True(t, tl.Truncated)
	require.Equal(t, 1000, tl.Counts.Transitions)
	require.Equal(t, 1000, tl.Counts.MessagesOut)
	require.Equal(t, 1000, tl.Counts.Parked)
	seen := map[string]bool{}
	for _, e := range tl.Events {
		seen[e.Note], seen[e.MessageID] = true, true
	}
	for _, newest := range []string{"note-1003", "out-1003", "park-1003", "note-4", "out-4", "park-4"} {
		require.True(t, seen[newest], "%s is among the newest 1000", newest)
	}
	for _, oldest := range []string{"note-3", "out-3", "park-3"} {
		require.False(t, seen[oldest], "%s is older than the newest 1000", oldest)
	}
}

// TestDiagram: GET /api/types/{type}/diagram.svg answers the type's state
// diagram as SVG to a read token, the current state highlighted and the
// visited ones marked; unknown types are 404, unknown states 400.
func TestDiagram(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const path = "/api/types/shop.order.v1.PlaceOrder/diagram.svg"

	req, err := http.NewRequest(http.MethodGet, b.http.URL+path+"?current=AUTHORIZE_PAYMENT&visited=RESERVE_INVENTORY", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	res, err := b.http.Client().Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(raw))
	require.Equal(t, "image/svg+xml", res.Header.Get("Content-Type"))
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'none'")
	require.True(t, strings.HasPrefix(string(raw), "<svg xmlns=\"http://www.w3.org/2000/svg\""), "an SVG document")
	require.Contains(t, string(raw), `<g class="state step current" data-state="AUTHORIZE_PAYMENT">`)
	require.Contains(t, string(raw), `<g class="state step visited" data-state="RESERVE_INVENTORY">`)

	code, plain := b.call(t, readToken, http.MethodGet, path, nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(plain), "current")
	require.NotContains(t, string(plain), "visited")

	for _, c := range []struct {
		method, path string
		code         int
		msg          string
	}{
		{"GET", path + "?current=SHIPPED", 400, `state "SHIPPED" is not a state of shop.order.v1.PlaceOrder`},
		{"GET", path + "?visited=COMPLETED,nope", 400, `state "nope" is not a state of shop.order.v1.PlaceOrder`},
		{"GET", path + "?colour=red", 400, `unknown query parameter "colour"`},
		{"GET", "/api/types/shop.Nope/diagram.svg", 404, `no saga type "shop.Nope" (served: shop.order.v1.PlaceOrder)`},
		{"POST", path, 405, "takes GET, HEAD only"},
	} {
		code, raw := b.call(t, readToken, c.method, c.path, nil)
		require.Equal(t, c.code, code, "%s %s: %s", c.method, c.path, raw)
		require.Contains(t, apiError(t, raw).Message, c.msg)
	}
}

// TestInternalErrorsAreLoggedUnderError: a request that fails inside the
// server answers a generic 500 and logs the cause under the key "error",
// the key every runtime log record uses.
func TestInternalErrorsAreLoggedUnderError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(t.Context(), `DROP TABLE saga_place_order`)
	require.NoError(t, err)
	code, raw := b.call(t, repairToken, http.MethodGet, "/api/sagas", nil)
	require.Equal(t, http.StatusInternalServerError, code, string(raw))
	recs := b.logs.Records(t, "admin request failed")
	require.Len(t, recs, 1)
	require.Contains(t, recs[0]["error"], "saga_place_order", "the cause, under error")
	require.NotContains(t, recs[0], "err")
}

// TestRequestsAreTraced: with a tracer, every API request is a span
// (continuing the caller's traceparent), so a repair's log line carries
// its trace id.
func TestRequestsAreTraced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &testenv.LogBuffer{}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv, err := admin.New(admin.Config{Pool: b.pool, Sagas: []*saga.Engine{b.engine}, Tokens: tokens, Now: b.clock.Now, Tracer: tp,
		Logger: slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(logs, nil), telemetry.LogOptions{}))})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	id := b.start(t, "order-traced")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+"/api/sagas/"+id+"/cancel",
		strings.NewReader(`{"expected_version": 1, "reason": "customer called"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+repairToken)
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	res, err := hs.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	recs := logs.Records(t, "admin repair")
	require.Len(t, recs, 1)
	require.Equal(t, traceID, recs[0]["trace_id"], "the caller's trace continues")
	require.Equal(t, id, recs[0]["saga_id"])
}

// TestTimelineOfAnEndedSaga: from an ended state the definition's table
// lists what every step's late replies would do; the timeline lists only
// those the instance can still get — replies to the commands it sent and
// events of External steps.
func TestTimelineOfAnEndedSaga(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-ended")
	b.reply(t, id, &inventoryv1.InventoryReservationFailed{OrderId: "order-ended"})
	require.Equal(t, "FAILED", b.status(t, id).State)

	def := orderv1.PlaceOrderDefinition()
	var table []string
	for _, tr := range def.Transitions {
		if tr.From == "FAILED" {
			table = append(table, tr.Trigger)
		}
	}
	require.Contains(t, table, "shop.payment.v1.PaymentAuthorized", "the table lists the later steps' replies")

	tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
	var next []string
	for _, n := range tl.Position.Next {
		next = append(next, n.Trigger)
	}
	require.Contains(t, next, "shop.inventory.v1.InventoryReserved", "a late reply to the command it sent")
	for _, never := range []string{"shop.payment.v1.PaymentAuthorized", "shop.payment.v1.PaymentAuthorizationFailed",
		"shop.shipping.v1.ShippingScheduled", "shop.order.v1.OrderApproved", "shop.inventory.v1.InventoryReleased"} {
		require.NotContains(t, next, never, "a reply to a command this saga never sent")
	}
}

// TestTimelineReceivedAt: a reply whose outbox row is in the saga's
// database is listed from that row once written, without ReceivedAt until
// the saga applies it, and once only after that.
func TestTimelineReceivedAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.start(t, "order-recv")
	m := &inventoryv1.InventoryReserved{OrderId: "order-recv"}
	env := b.replyEnvelope(t, id, m)
	b.publishReply(t, env)

	in := func() []admin.Event {
		tl := getJSON[admin.Timeline](t, b, "/api/sagas/"+id)
		var out []admin.Event
		for _, e := range tl.Events {
			if e.Kind == admin.EventMessage && e.Direction == "in" {
				out = append(out, e)
			}
		}
		require.Equal(t, len(out), tl.Counts.MessagesIn)
		return out
	}
	got := in()
	require.Len(t, got, 1)
	require.Equal(t, env.MessageID, got[0].MessageID)
	require.Nil(t, got[0].ReceivedAt, "written, not yet applied")
	require.False(t, got[0].Outside)

	b.clock.Advance(3 * time.Second)
	require.NoError(t, b.deliver(t, env, m))
	got = in()
	require.Len(t, got, 1, "listed from its outbox row only")
	require.NotNil(t, got[0].ReceivedAt)
	require.True(t, got[0].ReceivedAt.After(got[0].At), "applied after it was written")
	require.Contains(t, got[0].Summary, "received reply InventoryReserved")
}
