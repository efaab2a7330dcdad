package pypayment_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/examples/placeorder/app"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// python is Debian's interpreter, which python3-pika, python3-psycopg2 and
// python3-protobuf install into (a python3 earlier on PATH may not see them).
const python = "/usr/bin/python3"

const waitFor = 60 * time.Second

// need fails the test under CI=true and skips it otherwise when a tool is
// missing: scripts/ensure-tools.sh installs them.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	msg := what + " is missing; run scripts/ensure-tools.sh (apt-get install -y protobuf-compiler python3-pika python3-psycopg2 python3-protobuf)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// clock is the host's clock: real time plus an offset the test moves
// forward to fire a step's timeout.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

type bundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	dsn     string // libpq connection string of the test's schema
	amqpURL string
	pyPath  string // PYTHONPATH: the generated classes
	clock   *clock
	po      *orderv1.PlaceOrder
	ch      *amqp.Channel
}

// Queues the test reads the payment service's traffic from.
const (
	captureCommands = "pypayment.capture.commands"
	captureReplies  = "pypayment.capture.replies"
)

func TestPythonPayment(t *testing.T) {
	_, err := os.Stat(python)
	need(t, err == nil, python)
	need(t, exec.Command(python, "-c", "import pika, psycopg2, google.protobuf").Run() == nil, "python3-pika, python3-psycopg2 or python3-protobuf")
	protoc, err := exec.LookPath("protoc")
	need(t, err == nil, "protoc")
	b := setup(t, protoc)
	top := t // payment.py processes live until the test ends, not a subtest

	py := b.startPython(top)
	var first amqp.Delivery
	t.Run("Completes", func(t *testing.T) {
		id := b.start(t, request("o-py-1", "tok_visa"))
		st := b.wait(t, id, orderv1.PlaceOrderStateCompleted)
		require.Equal(t, []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}, b.ledger(t, "o-py-1"))
		var auth string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT authorization_id FROM payment_authorizations WHERE order_id = 'o-py-1'`).Scan(&auth))
		require.Equal(t, auth, st.Data.GetAuthorizationId(), "the saga folded the Python service's authorization")

		// The reply carries what docs/wire.md says a reply must carry,
		// and the Go runtime reads it as it reads its own.
		first = b.get(t, captureCommands)
		reply := b.get(t, captureReplies)
		env, err := message.FromDelivery(&reply)
		require.NoError(t, err)
		require.Equal(t, paymentv1.PaymentAuthorizedInfo.Exchange, reply.Exchange)
		require.Equal(t, paymentv1.PaymentAuthorizedInfo.RoutingKey, reply.RoutingKey)
		require.Equal(t, message.ContentType, reply.ContentType)
		require.Equal(t, amqp.Persistent, reply.DeliveryMode)
		require.NoError(t, uuid.Validate(env.MessageID))
		require.NotEqual(t, first.MessageId, env.MessageID)
		require.Equal(t, paymentv1.PaymentAuthorizedInfo.FullName, env.MessageType)
		require.Equal(t, int32(1), env.SchemaVersion)
		require.Equal(t, first.MessageId, env.CausationID, "causation: the command's message id")
		require.Equal(t, first.CorrelationId, env.CorrelationID)
		require.Equal(t, id, env.SagaID)
		require.Equal(t, "shop.order.v1.PlaceOrder", env.SagaType)
		require.WithinDuration(t, time.Now(), env.OccurredAt, time.Minute)
		require.Equal(t, "payment", env.Headers[message.HeaderOnce])
		var body paymentv1.PaymentAuthorized
		require.NoError(t, proto.Unmarshal(env.Body, &body))
		require.Equal(t, auth, body.GetAuthorizationId())
	})

	t.Run("DeclinedCardCompensates", func(t *testing.T) {
		id := b.start(t, request("o-py-2", app.DeclinedCard))
		st := b.wait(t, id, orderv1.PlaceOrderStateFailed)
		require.Equal(t, []string{"inventory:reserved", "payment:declined", "inventory:released"}, b.ledger(t, "o-py-2"),
			"the reservation is released after the Python service declined")
		require.Contains(t, st.Data.GetFailureReason(), "card declined")
		var held int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM inventory_reservations WHERE order_id = 'o-py-2' AND released_at IS NULL`).Scan(&held))
		require.Zero(t, held)
	})

	t.Run("SameCommandDeliveredTwice", func(t *testing.T) {
		require.NotEmpty(t, first.MessageId)
		b.send(t, first)
		py.waitEvent(t, "duplicate", first.MessageId)
		require.Equal(t, []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}, b.ledger(t, "o-py-1"),
			"the inbox absorbed the second delivery")
	})

	t.Run("CommandResentAfterTimeout", func(t *testing.T) {
		py.stop(t)
		_, err := b.ch.QueuePurge(captureCommands, false) // the commands of the orders above
		require.NoError(t, err)
		id := b.start(t, request("o-py-3", "tok_visa"))
		b.wait(t, id, orderv1.PlaceOrderStateAuthorizePayment)
		sent := b.get(t, captureCommands)
		b.clock.Advance(time.Minute + time.Second) // AuthorizePayment's timeout: 1m, then retry
		st := b.waitStatus(t, id, func(st saga.Status) bool { return st.Attempt == 2 })
		require.NotEqual(t, sent.MessageId, st.PendingMessageID, "the resend has a message id of its own")
		resent := b.get(t, captureCommands)
		require.Equal(t, st.PendingMessageID, resent.MessageId)
		require.Equal(t, sent.Headers[message.HeaderIdempotency], resent.Headers[message.HeaderIdempotency])

		py = b.startPython(top)
		py.waitEvent(t, "handled", sent.MessageId)
		py.waitEvent(t, "replayed", resent.MessageId)
		b.wait(t, id, orderv1.PlaceOrderStateCompleted)
		require.Equal(t, []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}, b.ledger(t, "o-py-3"),
			"one authorization for two commands")
		hist, err := b.po.Engine().History(b.ctx, id)
		require.NoError(t, err)
		var classes []string
		for _, r := range hist {
			if r.Trigger == paymentv1.PaymentAuthorizedInfo.FullName {
				classes = append(classes, r.Class)
			}
		}
		require.Len(t, classes, 2, "both replies reached the saga: %v", classes)
		require.Contains(t, classes, sagadef.ClassDuplicate.String(), "the second answer changed nothing")
	})

	t.Run("ParksWhatItCannotRead", func(t *testing.T) {
		newer := first
		newer.MessageId = uuid.NewString()
		newer.Headers = amqp.Table{}
		for k, v := range first.Headers {
			newer.Headers[k] = v
		}
		newer.Headers[message.HeaderSchemaVersion] = int32(2)
		b.send(t, newer)
		py.waitEvent(t, "parked", newer.MessageId)
		parked := b.get(t, "payment.commands.parking")
		require.Equal(t, newer.MessageId, parked.MessageId)
		require.Equal(t, "permanent", parked.Headers[message.HeaderParkClass])
		require.Equal(t, "permanent: schema version mismatch: shop.payment.v1.AuthorizePayment version 2 is newer than this consumer's version 1",
			parked.Headers[message.HeaderParkReason], "the reason the Go runtime gives (docs/wire.md)")
		require.Equal(t, "payment.commands", parked.Headers[message.HeaderOrigQueue])
		require.Equal(t, first.Exchange, parked.Headers[message.HeaderOrigExchange])
		require.Equal(t, first.RoutingKey, parked.Headers[message.HeaderOrigRoutingKey])
		attempt, ok, err := message.HeaderInt(parked.Headers, message.HeaderAttempt)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, int64(1), attempt)
		_, ok, err = message.HeaderTime(parked.Headers, message.HeaderFirstFailureAt)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, newer.Body, parked.Body)
	})
	py.stop(t)
}

func setup(t *testing.T, protoc string) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pgURL := testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &bundle{ctx: ctx, pool: pool, dsn: libpqDSN(t, pgURL), amqpURL: testenv.AMQP(t), clock: &clock{}, pyPath: t.TempDir()}

	// The Python classes, from the same .proto files as the Go code.
	gen := exec.Command(protoc, "-I", "..", "-I", "../../../options", "--python_out="+b.pyPath,
		"saga/v1/saga.proto", "shop/common/v1/common.proto", "shop/payment/v1/payment.proto")
	out, err := gen.CombinedOutput()
	require.NoError(t, err, "protoc --python_out: %s", out)

	// Every service but payment, and the saga, on a Go host.
	h, err := host.New(ctx, host.Config{
		Service: "placeorder-py", Pool: pool, AMQPURL: b.amqpURL, HTTPAddr: "127.0.0.1:0",
		TimeoutScanInterval: 100 * time.Millisecond, DrainTimeout: 5 * time.Second, Now: b.clock.Now,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, h.AddMigrations(app.Migrations()))
	require.NoError(t, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
	require.NoError(t, shippingv1.RegisterShippingParticipant(h, app.Shipping{}))
	require.NoError(t, orderv1.RegisterOrderParticipant(h, app.Approval{}))
	b.po, err = orderv1.RegisterPlaceOrder(h, app.Decider{})
	require.NoError(t, err)
	require.NoError(t, h.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, h.Stop(stopCtx))
	})
	for p, n := range map[string]int32{"widget": 1000, "gadget": 1000} {
		require.NoError(t, app.Restock(ctx, pool, p, n))
	}

	conn, err := broker.Dial(ctx, b.amqpURL, broker.ConnConfig{Name: "pypayment-test", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	b.ch, err = conn.Channel(ctx)
	require.NoError(t, err)
	cmd, ok, failed := paymentv1.AuthorizePaymentInfo, paymentv1.PaymentAuthorizedInfo, paymentv1.PaymentAuthorizationFailedInfo
	require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: cmd.Exchange, Kind: "direct"}, {Name: ok.Exchange, Kind: "direct"}},
		Queues:    []broker.Queue{{Name: captureCommands, Type: broker.QueueClassic}, {Name: captureReplies, Type: broker.QueueClassic}},
		Bindings: []broker.Binding{
			{Queue: captureCommands, Exchange: cmd.Exchange, RoutingKey: cmd.RoutingKey},
			{Queue: captureReplies, Exchange: ok.Exchange, RoutingKey: ok.RoutingKey},
			{Queue: captureReplies, Exchange: failed.Exchange, RoutingKey: failed.RoutingKey},
		},
	}))
	return b
}

// libpqDSN turns a testenv URL (whose search_path and application_name
// query parameters only pgx reads) into a libpq connection string.
func libpqDSN(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	pw, _ := u.User.Password()
	kv := [][2]string{
		{"host", u.Hostname()}, {"port", u.Port()}, {"dbname", strings.TrimPrefix(u.Path, "/")},
		{"user", u.User.Username()}, {"password", pw}, {"sslmode", q.Get("sslmode")},
		{"application_name", q.Get("application_name")}, {"options", "-c search_path=" + q.Get("search_path")},
	}
	var parts []string
	for _, p := range kv {
		if p[1] != "" {
			parts = append(parts, p[0]+"='"+strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(p[1])+"'")
		}
	}
	return strings.Join(parts, " ")
}

func request(order, card string) *orderv1.PlaceOrderRequest {
	return &orderv1.PlaceOrderRequest{
		OrderId:         order,
		CustomerId:      "c-1",
		Lines:           []*commonv1.OrderLine{{ProductId: "widget", Quantity: 2}, {ProductId: "gadget", Quantity: 1}},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 4999},
		ShippingAddress: &commonv1.Address{Name: "A. Customer", Street: "1 Main St", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       card,
	}
}

func (b *bundle) start(t *testing.T, req *orderv1.PlaceOrderRequest) string {
	t.Helper()
	id, created, err := b.po.Start(b.ctx, req, message.Meta{})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

func (b *bundle) wait(t *testing.T, id string, state orderv1.PlaceOrderState) *orderv1.PlaceOrderSnapshot {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.po.GetByID(b.ctx, id)
		require.NoError(t, err)
		if st.State == state {
			return st
		}
		require.True(t, time.Now().Before(deadline), "saga %s is %s (%s), want %s", id, st.State, st.LastError, state)
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bundle) waitStatus(t *testing.T, id string, ok func(saga.Status) bool) saga.Status {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		st, err := b.po.Status(b.ctx, id)
		require.NoError(t, err)
		if ok(st) {
			return st
		}
		require.True(t, time.Now().Before(deadline), "saga %s: %+v", id, st)
		time.Sleep(20 * time.Millisecond)
	}
}

// ledger lists the order's business effects, "service:effect", in order.
func (b *bundle) ledger(t *testing.T, order string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT service || ':' || effect FROM shop_ledger WHERE order_id = $1 ORDER BY id`, order)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// get waits for a message in queue and takes it.
func (b *bundle) get(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		d, ok, err := b.ch.Get(queue, true)
		require.NoError(t, err)
		if ok {
			return d
		}
		require.True(t, time.Now().Before(deadline), "nothing arrived in %s", queue)
		time.Sleep(20 * time.Millisecond)
	}
}

// send publishes d again, as it was: the same message id and headers.
func (b *bundle) send(t *testing.T, d amqp.Delivery) {
	t.Helper()
	require.NoError(t, b.ch.PublishWithContext(b.ctx, d.Exchange, d.RoutingKey, false, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode, CorrelationId: d.CorrelationId,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, Body: d.Body,
	}))
}

// pyProc is a running payment.py and the events it printed.
type pyProc struct {
	cmd     *exec.Cmd
	stderr  *bytes.Buffer
	mu      sync.Mutex
	events  []map[string]any
	done    chan error // its exit, once
	stopped bool       // its exit was taken from done
}

func (b *bundle) startPython(t *testing.T) *pyProc {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	p := &pyProc{stderr: new(bytes.Buffer), done: make(chan error, 1)}
	p.cmd = exec.Command(python, filepath.Join(dir, "payment.py"))
	p.cmd.Env = append(os.Environ(),
		"PYTHONPATH="+b.pyPath,
		"PYTHONDONTWRITEBYTECODE=1",
		"SAGA_PY_PG_DSN="+b.dsn,
		"SAGA_AMQP_URL="+b.amqpURL,
		"SAGA_PY_TOPOLOGY="+filepath.Join(dir, "..", "shop", "payment", "v1", "topology.saga.json"))
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				p.mu.Lock()
				p.events = append(p.events, ev)
				p.mu.Unlock()
			}
		}
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if !p.stopped {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("payment.py events: %v\nstderr:\n%s", p.snapshot(), p.stderr.String())
		}
	})
	p.waitEvent(t, "ready", "")
	return p
}

func (p *pyProc) snapshot() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.events...)
}

// waitEvent waits until payment.py printed event (for messageID, when set).
func (p *pyProc) waitEvent(t *testing.T, event, messageID string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		for _, ev := range p.snapshot() {
			if ev["event"] == event && (messageID == "" || ev["message_id"] == messageID) {
				return
			}
			if ev["event"] == "parked" || ev["event"] == "retry" {
				t.Fatalf("payment.py could not handle a message: %v", ev)
			}
		}
		select {
		case err := <-p.done:
			p.stopped = true
			t.Fatalf("payment.py exited (%v) before %s %s: %s", err, event, messageID, p.stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "payment.py printed no %s for %q: %v", event, messageID, p.snapshot())
		time.Sleep(20 * time.Millisecond)
	}
}

// stop asks payment.py to stop (SIGTERM) and waits for it.
func (p *pyProc) stop(t *testing.T) {
	t.Helper()
	if p.stopped {
		return
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.done:
		p.stopped = true
		require.NoError(t, err, "payment.py: %s", p.stderr.String())
	case <-time.After(waitFor):
		t.Fatal("payment.py did not stop")
	}
}
