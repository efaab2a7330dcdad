package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/schema"
)

const (
	repairTok = "cli-repair-token-0123456789"
	readTok   = "cli-read-token-0123456789ab"
)

// decider is a minimal Place Order decider for the CLI tests.
type decider struct{ orderv1.PlaceOrderNoopFolds }

func (decider) Start(_ context.Context, r *orderv1.PlaceOrderRequest) (*orderv1.PlaceOrderData, error) {
	return &orderv1.PlaceOrderData{OrderId: r.GetOrderId(), CardToken: r.GetCardToken()}, nil
}
func (decider) BuildReserveInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReserveInventory, error) {
	return &inventoryv1.ReserveInventory{OrderId: d.GetOrderId()}, nil
}
func (decider) BuildReleaseInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReleaseInventory, error) {
	return &inventoryv1.ReleaseInventory{OrderId: d.GetOrderId()}, nil
}
func (decider) BuildAuthorizePayment(_ context.Context, d *orderv1.PlaceOrderData) (*paymentv1.AuthorizePayment, error) {
	return &paymentv1.AuthorizePayment{OrderId: d.GetOrderId(), CardToken: d.GetCardToken()}, nil
}
func (decider) BuildScheduleShipping(_ context.Context, d *orderv1.PlaceOrderData) (*shippingv1.ScheduleShipping, error) {
	return &shippingv1.ScheduleShipping{OrderId: d.GetOrderId()}, nil
}
func (decider) BuildApproveOrder(_ context.Context, d *orderv1.PlaceOrderData) (*orderv1.ApproveOrder, error) {
	return &orderv1.ApproveOrder{OrderId: d.GetOrderId()}, nil
}

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type fixture struct {
	pool   *pgxpool.Pool
	engine *saga.Engine
	clock  *testClock
	url    string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	clk := &testClock{now: time.Now().UTC().Truncate(time.Second)}
	quiet := slog.New(slog.DiscardHandler)
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool, Now: clk.Now, Logger: quiet}, decider{})
	require.NoError(t, err)
	srv, err := admin.New(admin.Config{Pool: pool, Sagas: []*saga.Engine{po.Engine()}, Logger: quiet, Now: clk.Now,
		Tokens: admin.Tokens{repairTok: {Name: "cli-op", Role: admin.RoleRepair}, readTok: {Name: "cli-viewer", Role: admin.RoleRead}}})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &fixture{pool: pool, engine: po.Engine(), clock: clk, url: hs.URL}
}

func (f *fixture) start(t *testing.T, order string) string {
	t.Helper()
	id, _, err := f.engine.Start(context.Background(), &orderv1.PlaceOrderRequest{OrderId: order, CardToken: "tok_secret_4242"}, message.Meta{})
	require.NoError(t, err)
	return id
}

func (f *fixture) status(t *testing.T, id string) saga.Status {
	t.Helper()
	st, err := f.engine.Status(context.Background(), id)
	require.NoError(t, err)
	return st
}

// review drives a saga into MANUAL_REVIEW (payment times out three times).
func (f *fixture) review(t *testing.T, order string) string {
	t.Helper()
	id := f.start(t, order)
	m := &inventoryv1.InventoryReserved{OrderId: order}
	env, err := message.New(m, message.Meta{SagaID: id, SagaType: "shop.order.v1.PlaceOrder", CausationID: f.status(t, id).PendingMessageID})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		return f.engine.Handle(context.Background(), tx, &consumer.Delivery{Envelope: env, Message: m, Attempt: 1})
	}))
	for range 3 {
		f.clock.Advance(2 * time.Minute)
		_, err := f.engine.FireTimeouts(context.Background(), 10)
		require.NoError(t, err)
	}
	require.Equal(t, "MANUAL_REVIEW", f.status(t, id).State)
	return id
}

// park records a parked reply for the saga's pending command.
func (f *fixture) park(t *testing.T, id string) int64 {
	t.Helper()
	st := f.status(t, id)
	env, err := message.New(&inventoryv1.InventoryReserved{OrderId: st.BusinessKey},
		message.Meta{SagaID: id, SagaType: st.Type, CausationID: st.PendingMessageID})
	require.NoError(t, err)
	headers, err := json.Marshal(env.Publishing().Headers)
	require.NoError(t, err)
	var pid int64
	require.NoError(t, f.pool.QueryRow(context.Background(), `INSERT INTO saga_parked (message_id, queue, message_type,
	saga_id, saga_type, correlation_id, class, reason, attempts, exchange, routing_key, headers, body, first_failure_at)
VALUES ($1, 'order.saga.place_order', $2, $3, $4, $5, 'exhausted', 'handler timed out', 5, $6, $7, $8, $9, now())
RETURNING id`, env.MessageID, env.MessageType, env.SagaID, env.SagaType, env.CorrelationID, env.Exchange, env.RoutingKey,
		headers, env.Body).Scan(&pid))
	return pid
}

// sagactl runs the CLI with the fixture's server and token in the
// environment and returns its exit status, stdout and stderr.
func (f *fixture) sagactl(t *testing.T, token string, args ...string) (int, string, string) {
	t.Helper()
	env := func(k string) string {
		switch k {
		case "SAGACTL_SERVER":
			return f.url
		case "SAGACTL_TOKEN":
			return token
		}
		return ""
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut, env)
	return code, out.String(), errOut.String()
}

func TestSagasCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rv := f.review(t, "cli-review")
	stuck := f.start(t, "cli-stuck")
	f.clock.Advance(2 * time.Minute) // past its 30 s timeout plus the 1 min grace

	code, out, errOut := f.sagactl(t, readTok, "sagas", "list")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^ID\s+TYPE\s+BUSINESS KEY\s+STATE\s+VERSION\s+UPDATED\s+ATTENTION$`, lines[0])
	require.Regexp(t, `^`+stuck+`\s+PlaceOrder\s+cli-stuck\s+RESERVE_INVENTORY\s+1\s+\S+\s+STUCK: timeout due`, lines[1])
	require.Regexp(t, `^`+rv+`\s+PlaceOrder\s+cli-review\s+MANUAL_REVIEW\s+\d+\s+\S+\s+REVIEW: `, lines[2])
	require.Equal(t, "2 saga(s)", lines[3])

	code, out, errOut = f.sagactl(t, readTok, "sagas", "list", "--stuck", "--json")
	require.Equal(t, 0, code, errOut)
	var page admin.SagaPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Items, 1)
	require.Equal(t, stuck, page.Items[0].ID)

	code, out, errOut = f.sagactl(t, readTok, "sagas", "list", "--limit", "1", "--all", "--json")
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Items, 2, "--all follows the cursor")

	code, out, errOut = f.sagactl(t, readTok, "sagas", "show", rv)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "state     MANUAL_REVIEW (manual review)")
	require.Contains(t, out, "where     in manual review since")
	require.Contains(t, out, "[MANUAL_REVIEW]")
	require.Contains(t, out, "RESERVE_INVENTORY*")
	require.Regexp(t, `(?m)^next      InventoryReserved → MANUAL_REVIEW$`, out)
	require.Regexp(t, `(?m)^\s+operator.retry → AUTHORIZE_PAYMENT \(sends AuthorizePayment\)$`, out)
	require.NotContains(t, out, "operator.retry → RESERVE_INVENTORY", "retry resumes the state it came from")
	require.Contains(t, out, `"card_token":"[REDACTED]"`)
	require.NotContains(t, out, "tok_secret_4242")
	require.Regexp(t, `timeline: \d+ transitions, 4 sent, 1 received, 2 retries, 0 parked`, out)
	require.Regexp(t, `(?m)^\S+\s+message in\s+received InventoryReserved \(sent from outside this database\)\s+message \S+, applied \S+$`, out)
	require.Regexp(t, `(?m)^\S+\s+transition\s+RESERVE_INVENTORY → AUTHORIZE_PAYMENT: InventoryReserved \S+ \[new\] — step ReserveInventory succeeded.*\s+message \S+, causation \S+$`, out)

	code, out, errOut = f.sagactl(t, readTok, "sagas", "show", rv, "--json")
	require.Equal(t, 0, code, errOut)
	var tl admin.Timeline
	require.NoError(t, json.Unmarshal([]byte(out), &tl))
	require.Equal(t, rv, tl.Saga.ID)

	// Repairs: version looked up, recorded with who and why.
	code, out, errOut = f.sagactl(t, repairTok, "sagas", "retry", rv, "--reason", "provider back")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "deciding on version")
	require.Regexp(t, `^retry applied: saga `+rv+` is AUTHORIZE_PAYMENT \(version \d+\)\n$`, out)
	h, err := f.engine.History(context.Background(), rv)
	require.NoError(t, err)
	last := h[len(h)-1]
	require.Equal(t, "cli-op", last.Operator)
	require.Contains(t, last.Note, "provider back")

	code, _, errOut = f.sagactl(t, repairTok, "sagas", "compensate", rv, "--reason", "x", "--version", "1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "409 version_conflict: saga "+rv+" changed since you looked")

	code, _, errOut = f.sagactl(t, readTok, "sagas", "cancel", rv, "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "403 forbidden")

	// Bulk: dry run first, then for real.
	code, out, errOut = f.sagactl(t, repairTok, "sagas", "cancel", "--stuck", "--reason", "outage", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^`+stuck+`\s+PlaceOrder\s+cli-stuck\s+RESERVE_INVENTORY\s+1\s+would_apply\s+CANCELLED\s*$`, out)
	require.Contains(t, out, "cancel dry run: 1 would_apply")
	require.Equal(t, "RESERVE_INVENTORY", f.status(t, stuck).State)
	code, out, errOut = f.sagactl(t, repairTok, "sagas", "cancel", "--stuck", "--reason", "outage")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "cancel done: 1 applied")
	require.Equal(t, "CANCELLED", f.status(t, stuck).State)

	code, out, errOut = f.sagactl(t, repairTok, "sagas", "cancel", stuck, "--reason", "again", "--json")
	require.Equal(t, 0, code, errOut)
	var res admin.ActionResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, admin.OutcomeAlreadyApplied, res.Outcome)
}

func TestParkedCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.start(t, "cli-parked")
	pid := f.park(t, id)
	sid := strconv.FormatInt(pid, 10)

	code, out, errOut := f.sagactl(t, readTok, "parked", "list")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^ID\s+MESSAGE\s+SAGA\s+BUSINESS KEY\s+STEP\s+QUEUE\s+CLASS\s+ATTEMPTS\s+FIRST FAILURE\s+LAST FAILURE\s+STANDING\s+REASON$`, lines[0])
	require.Regexp(t, `^`+sid+`\s+InventoryReserved\s+`+id+`\s+cli-parked\s+ReserveInventory\s+order.saga.place_order\s+exhausted\s+5\s+\S+\s+\S+\s+CURRENT\s+handler timed out$`, lines[1])
	require.Equal(t, "1 parked message(s)", lines[2])

	code, out, errOut = f.sagactl(t, readTok, "parked", "show", sid)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "step        ReserveInventory")
	require.Contains(t, out, `body        {"order_id":"cli-parked"}`)

	code, out, errOut = f.sagactl(t, repairTok, "parked", "replay", sid, "--reason", "handler fixed", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "parked message "+sid+": would replay")
	require.Contains(t, out, "check: the saga waits for it in RESERVE_INVENTORY: it will be applied")

	code, out, errOut = f.sagactl(t, repairTok, "parked", "replay", sid, "--reason", "handler fixed")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "parked message "+sid+": replayed")
	require.Contains(t, out, "is back in the outbox to shop.inventory.v1.replies / reply.shop.inventory.v1.inventory-reserved")

	code, out, errOut = f.sagactl(t, repairTok, "parked", "replay", sid, "--reason", "handler fixed", "--json")
	require.Equal(t, 0, code, errOut)
	var rr admin.ReplayResult
	require.NoError(t, json.Unmarshal([]byte(out), &rr))
	require.Equal(t, admin.OutcomeAlreadyReplay, rr.Outcome)

	code, out, errOut = f.sagactl(t, readTok, "parked", "list", "--replayed", "--json")
	require.Equal(t, 0, code, errOut)
	var pp admin.ParkedPage
	require.NoError(t, json.Unmarshal([]byte(out), &pp))
	require.Len(t, pp.Items, 1)
	require.Equal(t, "cli-op", pp.Items[0].ReplayedBy)
	require.Equal(t, "handler fixed", pp.Items[0].ReplayReason)
	code, out, errOut = f.sagactl(t, readTok, "parked", "show", sid)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^replayed +\S+ by cli-op: handler fixed$`, out)

	// Bulk replay over a filter: nothing left open.
	code, out, errOut = f.sagactl(t, repairTok, "parked", "replay", "--queue", "order.saga.place_order", "--reason", "sweep", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "replay dry run: nothing matched")
}

// TestFindCommands: stats, search, the operator log, the list's prefix
// and order, and dismissing a parked copy that no longer applies.
func TestFindCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	first := f.start(t, "find-1")
	f.clock.Advance(time.Second)
	second := f.start(t, "find-2")
	pid := f.park(t, second)
	sid := strconv.FormatInt(pid, 10)

	code, out, errOut := f.sagactl(t, readTok, "stats")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^PlaceOrder\s+RESERVE_INVENTORY\s+step\s+2\s*$`, out)
	require.Regexp(t, `(?m)^PlaceOrder\s+COMPLETED\s+terminal\s+0\s*$`, out)
	require.Contains(t, out, "open parked messages: 1 (order.saga.place_order 1)")

	code, out, errOut = f.sagactl(t, readTok, "search", "find-")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^business key prefix\s+`+second+`\s+PlaceOrder\s+find-2\s+RESERVE_INVENTORY`, out)
	require.Regexp(t, `(?m)^business key prefix\s+`+first+`\s+PlaceOrder\s+find-1\s+RESERVE_INVENTORY`, out)
	code, out, errOut = f.sagactl(t, readTok, "search", first)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^saga id\s+`+first, out)

	code, out, errOut = f.sagactl(t, readTok, "sagas", "list", "--prefix", "find-", "--oldest")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.True(t, strings.HasPrefix(lines[1], first) && strings.HasPrefix(lines[2], second), out)
	code, out, errOut = f.sagactl(t, readTok, "sagas", "list", "--created-after", "1h", "--prefix", "find-2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 saga(s)")

	// The reply arrives after all: the parked copy no longer applies.
	st := f.status(t, second)
	m := &inventoryv1.InventoryReserved{OrderId: "find-2"}
	env, err := message.New(m, message.Meta{SagaID: second, SagaType: st.Type, CausationID: st.PendingMessageID})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		return f.engine.Handle(context.Background(), tx, &consumer.Delivery{Envelope: env, Message: m, Attempt: 1})
	}))
	code, out, errOut = f.sagactl(t, readTok, "parked", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "superseded")
	code, out, errOut = f.sagactl(t, repairTok, "parked", "dismiss", "--saga", second, "--reason", "the reply came", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^`+sid+`\s+InventoryReserved\s+`+second+`\s+would_dismiss\s+its outcome is already recorded`, out)
	code, out, errOut = f.sagactl(t, repairTok, "parked", "dismiss", sid, "--reason", "the reply came")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "parked message "+sid+": dismissed")
	code, out, errOut = f.sagactl(t, readTok, "parked", "list", "--replayed")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "dismissed by cli-op")
	code, _, errOut = f.sagactl(t, repairTok, "parked", "dismiss", "--reason", "x")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "want a parked message ID, or filter flags")

	code, out, errOut = f.sagactl(t, readTok, "log")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^\S+\s+cli-op\s+dismiss\s+`+second+`\s+find-2\s+AUTHORIZE_PAYMENT\s+reason: the reply came; dismissed parked message `+sid, out)
	require.Contains(t, out, "1 action(s)")
}

func TestAdminCommandErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	none := func(string) string { return "" }
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"sagas"}, 2, "missing subcommand"},
		{[]string{"sagas", "frob"}, 2, `unknown subcommand "frob"`},
		{[]string{"parked", "frob"}, 2, `unknown subcommand "frob"`},
		{[]string{"sagas", "list"}, 2, "no admin server"},
		{[]string{"sagas", "list", "--server", "http://x"}, 2, "no token"},
		{[]string{"sagas", "list", "--server", "ftp://x", "--token", "t"}, 2, "want an http:// or https:// URL"},
		{[]string{"sagas", "list", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"sagas", "show"}, 2, "want exactly one saga ID"},
		{[]string{"sagas", "retry", "id"}, 2, "--reason is required"},
		{[]string{"sagas", "retry", "--reason", "r"}, 2, "want a saga ID, or filter flags"},
		{[]string{"sagas", "retry", "id", "--stuck", "--reason", "r"}, 2, "not both"},
		{[]string{"sagas", "retry", "id", "--reason", "r", "--dry-run"}, 2, "--dry-run and --max are for bulk"},
		{[]string{"sagas", "resolve", "id", "--reason", "r"}, 2, "resolve needs --to"},
		{[]string{"parked", "replay", "--reason", "r"}, 2, "want a parked message ID, or filter flags"},
		{[]string{"parked", "replay", "--queue", "q", "--reason", "r", "--force"}, 2, "--force replays one message"},
		{[]string{"sagas", "list", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{[]string{"parked", "list", "--timeout", "-1s", "--server", "http://x", "--token", "t"}, 2, "--timeout must be positive"},
		{[]string{"sagas", "retry", "id", "--reason", "r", "--version", "-1"}, 2, "--version -1: want the positive version"},
		{[]string{"sagas", "retry", "id", "--reason", "r", "--to", "COMPLETED"}, 2, "--to is only for resolve"},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		require.Equal(t, c.code, run(ctx, c.args, &out, &errOut, none), "%v: %s", c.args, errOut.String())
		require.Contains(t, errOut.String(), c.msg, "%v", c.args)
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"sagas", "-h"}, {"parked", "--help"}, {"sagas", "list", "-h"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, args, &out, &errOut, none), "%v: %s", args, errOut.String())
		require.Contains(t, strings.ToLower(out.String()+errOut.String()), "usage", "%v", args)
	}
	// Against a server: a wrong token and a bad id are reported with the
	// API's words; what the server refuses as malformed (400) is a usage
	// error.
	f := newFixture(t)
	code, _, errOut := f.sagactl(t, "not-a-valid-token-0000000", "sagas", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "401 unauthenticated")
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"sagas", "show", "nope"}, `400 bad_request: saga id "nope" is not a UUID`},
		{[]string{"sagas", "list", "--state", "NOPE"}, `state "NOPE" is not a state of shop.order.v1.PlaceOrder`},
		{[]string{"sagas", "list", "--limit", "0"}, `limit="0": want a whole number from 1 to 200`},
		{[]string{"parked", "show", "0"}, "want a positive whole number"},
	} {
		code, _, errOut = f.sagactl(t, readTok, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.msg, "%v", c.args)
	}
	code, _, errOut = f.sagactl(t, readTok, "sagas", "show", "01a22c76-0fb8-7a57-a81a-91aa2350331d")
	require.Equal(t, 1, code, "a saga that does not exist is no usage error")
	require.Contains(t, errOut, "404 not_found")
}

// TestHumanOutputEscapesControlCharacters: text from elsewhere (a business
// key, a handler's error) reaches the operator's terminal escaped: no
// escape sequence acts, no line break or tab forges a row or a cell. JSON
// output stays JSON.
func TestHumanOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const evil = "evil\x1b[31m\r\nFORGED\trow\u2028\u0085\x7f\u009b2J"
	const escaped = `evil\x1b[31m\r\nFORGED\trow\u2028\u0085\x7f\u009b2J`
	id := f.start(t, evil)
	pid := f.park(t, id)
	_, err := f.pool.Exec(context.Background(), `UPDATE saga_parked SET reason = $1`, "handler failed: "+evil)
	require.NoError(t, err)
	sid := strconv.FormatInt(pid, 10)

	for _, args := range [][]string{
		{"sagas", "list"},
		{"sagas", "show", id},
		{"sagas", "cancel", "--key", evil, "--reason", "r", "--dry-run"},
		{"parked", "list"},
		{"parked", "show", sid},
	} {
		code, out, errOut := f.sagactl(t, repairTok, args...)
		require.Equal(t, 0, code, "%v: %s", args, errOut)
		require.Contains(t, out, escaped, "%v", args)
		require.False(t, strings.ContainsFunc(out, func(r rune) bool {
			return r != '\n' && (r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == '\u2028' || r == '\u2029')
		}), "%v printed a control character: %q", args, out)
		require.NotRegexp(t, `(?m)^FORGED`, out, "%v", args)
	}

	code, out, errOut := f.sagactl(t, readTok, "sagas", "list", "--json")
	require.Equal(t, 0, code, errOut)
	var page admin.SagaPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Equal(t, evil, page.Items[0].BusinessKey, "JSON carries the text as it is")
}

func TestPrintTimelineSaysWhenCut(t *testing.T) {
	t.Parallel()
	for _, cut := range []bool{false, true} {
		var out bytes.Buffer
		require.NoError(t, printTimeline(&out, admin.Timeline{Truncated: cut}))
		require.Equal(t, cut, strings.Contains(out.String(), "CUT: the saga has more than 1000"), out.String())
	}
}

func TestPrintTimelineEndedSagaHasNoNext(t *testing.T) {
	t.Parallel()
	next := []admin.TransitionView{{Trigger: "shop.inventory.v1.InventoryReserved", To: "MANUAL_REVIEW"}}
	for kind, label := range map[string]string{"terminal": "if late", "step": "next"} {
		var out bytes.Buffer
		tl := admin.Timeline{Saga: admin.Saga{State: "X", StateKind: kind}, Position: admin.Position{Next: next}}
		require.NoError(t, printTimeline(&out, tl))
		require.Regexp(t, `(?m)^`+label+` +InventoryReserved → MANUAL_REVIEW$`, out.String())
	}
}

func TestCallbacksCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.start(t, "cli-callback")
	cbID := "0193a6c0-0000-7000-8000-0000000000c1"
	require.NoError(t, pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		return callback.EnqueueTx(context.Background(), tx, callback.Delivery{URL: "gopher://client.example/", Payload: callback.Payload{
			CallbackID: cbID, SagaID: id, SagaType: "shop.order.v1.PlaceOrder", Event: "saga.completed", State: "COMPLETED"}})
	}))

	code, out, errOut := f.sagactl(t, readTok, "callbacks", "list", "--saga", id)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^ID\s+SAGA\s+EVENT\s+STATUS\s+ATTEMPTS\s+TARGET\s+CREATED\s+LAST\s+REASON$`, lines[0])
	require.Regexp(t, `^`+cbID+`\s+`+id+`\s+saga.completed\s+parked\s+0\s+gopher://client.example/\s+\S+\s+callback URL "gopher://client.example/": want an absolute http or https URL$`, lines[1])
	require.Equal(t, "1 callback(s)", lines[2])

	code, _, errOut = f.sagactl(t, repairTok, "callbacks", "replay", cbID)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason is required")
	code, _, errOut = f.sagactl(t, readTok, "callbacks", "replay", cbID, "--reason", "fixed")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "403")

	code, out, errOut = f.sagactl(t, repairTok, "callbacks", "replay", cbID, "--reason", "client moved to https")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "callback "+cbID+": due again (saga "+id+", saga.completed), replayed by cli-op: client moved to https\n", out)

	code, out, errOut = f.sagactl(t, readTok, "callbacks", "list", "--status", "pending", "--json")
	require.Equal(t, 0, code, errOut)
	var list admin.CallbackList
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Callbacks, 1)
	require.Equal(t, cbID, list.Callbacks[0].ID)

	code, _, errOut = f.sagactl(t, repairTok, "callbacks", "replay", cbID, "--reason", "again")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not parked")
}
