package gen_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	pricingv1 "github.com/protosaga/saga/examples/quoteapproval/pricing/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/schema"
)

type startResponse struct {
	SagaID        string `json:"sagaId"`
	CorrelationID string `json:"correlationId"`
	Status        string `json:"status"`
	StatusURL     string `json:"statusUrl"`
	Created       bool   `json:"created"`
}

// TestPlaceOrderHTTPStart applies the generated migrations with the
// runtime's, starts the generated saga through its HTTP handler (202 with
// the saga id and status URL, idempotent on the business key), and checks
// the instance row and the state constraint.
func TestPlaceOrderHTTPStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool}, placeOrder{})
	require.NoError(t, err)
	require.Equal(t, "order.saga.place_order", po.Queue())
	srv := httptest.NewServer(po.HTTPHandler(func(id string) string { return "/orders/status/" + id }))
	t.Cleanup(srv.Close)

	body, err := protojson.Marshal(placeOrderRequest())
	require.NoError(t, err)
	post := func(b []byte) (*http.Response, startResponse) {
		t.Helper()
		resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(b))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out startResponse
		if resp.StatusCode == http.StatusAccepted {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		}
		return resp, out
	}
	resp, first := post(body)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, "/orders/status/"+first.SagaID, resp.Header.Get("Location"))
	require.Equal(t, startResponse{SagaID: first.SagaID, CorrelationID: "o-1", Status: "ACCEPTED",
		StatusURL: "/orders/status/" + first.SagaID, Created: true}, first)

	resp, again := post(body)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, first.SagaID, again.SagaID, "start is idempotent on the business key")
	require.False(t, again.Created)

	resp, _ = post([]byte(`{"orderId": 5}`))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	getResp, err := http.Get(srv.URL)
	require.NoError(t, err)
	getResp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, getResp.StatusCode)

	st, err := po.Status(ctx, first.SagaID)
	require.NoError(t, err)
	require.Equal(t, string(orderv1.PlaceOrderStateReserveInventory), st.State)
	require.Equal(t, "o-1", st.BusinessKey)

	var outbox int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE message_type = 'shop.inventory.v1.ReserveInventory'`).Scan(&outbox))
	require.Equal(t, 1, outbox, "one command for two starts")

	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'NOT_A_STATE'`)
	require.ErrorContains(t, err, "saga_place_order_state_check")
}

// TestPlaceOrderTypedReadsAndRoutes mounts the generated start and status
// handlers at their generated patterns (the start handler's status URL
// defaults to the status route), and reads the started saga back through
// the generated typed Get, GetByID and List.
func TestPlaceOrderTypedReadsAndRoutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()))
	po, err := orderv1.NewPlaceOrder(saga.Config{Pool: pool}, placeOrder{})
	require.NoError(t, err)
	require.Equal(t, "POST /sagas/place_order", po.StartPattern())
	require.Equal(t, "GET /sagas/place_order/{id}", po.StatusPattern())
	mux := http.NewServeMux()
	mux.Handle(po.StartPattern(), po.HTTPHandler(nil))
	mux.Handle(po.StatusPattern(), po.StatusHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	body, err := protojson.Marshal(placeOrderRequest())
	require.NoError(t, err)
	resp, err := http.Post(srv.URL+"/sagas/place_order", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var started startResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
	require.Equal(t, "/sagas/place_order/"+started.SagaID, started.StatusURL)

	statusResp, err := http.Get(srv.URL + started.StatusURL)
	require.NoError(t, err)
	defer statusResp.Body.Close()
	require.Equal(t, http.StatusOK, statusResp.StatusCode)
	var status saga.StatusResponse
	require.NoError(t, json.NewDecoder(statusResp.Body).Decode(&status))
	require.Equal(t, saga.StatusResponse{SagaID: started.SagaID, SagaType: "shop.order.v1.PlaceOrder", BusinessKey: "o-1",
		State: string(orderv1.PlaceOrderStateReserveInventory), Status: saga.PhaseRunning, UpdatedAt: status.UpdatedAt}, status)

	snap, err := po.Get(ctx, "o-1")
	require.NoError(t, err)
	require.Equal(t, started.SagaID, snap.ID)
	require.Equal(t, orderv1.PlaceOrderStateReserveInventory, snap.State)
	require.False(t, snap.State.Terminal())
	require.True(t, snap.State.Valid())
	require.False(t, orderv1.PlaceOrderState("NOT_A_STATE").Valid())
	require.True(t, orderv1.PlaceOrderStateCancelled.Terminal())
	require.Equal(t, "o-1", snap.Data.GetOrderId(), "the typed saga data")
	byID, err := po.GetByID(ctx, started.SagaID)
	require.NoError(t, err)
	require.Equal(t, snap, byID)
	_, err = po.Get(ctx, "o-none")
	require.ErrorIs(t, err, saga.ErrNotFound)

	page, err := po.List(ctx, orderv1.PlaceOrderFilter{States: []orderv1.PlaceOrderState{orderv1.PlaceOrderStateReserveInventory}})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, started.SagaID, page.Items[0].ID)
	page, err = po.List(ctx, orderv1.PlaceOrderFilter{States: []orderv1.PlaceOrderState{orderv1.PlaceOrderStateCompleted}})
	require.NoError(t, err)
	require.Empty(t, page.Items)
}

// TestQuoteApprovalCancelTx: the generated CancelTx writes the cancel
// command to the outbox, routed to the saga's own queue; delivered to the
// generated handler, it releases the held price, and the audit row names
// who asked and why.
func TestQuoteApprovalCancelTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool, quotev1.QuoteApprovalMigrations()))
	qa, err := quotev1.NewQuoteApproval(saga.Config{Pool: pool}, quoteApproval{})
	require.NoError(t, err)
	handle := func(m message.Message, meta message.Meta) error {
		t.Helper()
		env, err := message.New(m, meta)
		require.NoError(t, err)
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return qa.Engine().Handle(ctx, tx, &consumer.Delivery{Envelope: env, Message: m, Queue: qa.Queue(), Attempt: 1})
		})
	}
	deliver := func(m message.Message, meta message.Meta) {
		t.Helper()
		require.NoError(t, handle(m, meta))
	}
	id, _, err := qa.Start(ctx, &quotev1.SubmitQuote{QuoteId: "q-1", PriceVersion: 3}, message.Meta{})
	require.NoError(t, err)
	st, err := qa.GetByID(ctx, id)
	require.NoError(t, err)
	err = handle(&pricingv1.QuotePriced{QuoteId: "q-1"}, message.Meta{SagaID: id, CausationID: st.Data.GetQuoteId()})
	require.ErrorIs(t, err, sagadef.ErrMisaddressed, "a reply that answers no command sent is refused")
	st, err = qa.GetByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, quotev1.QuoteApprovalStatePriceQuote, st.State, "a reply that answers no command sent changes nothing")
	status, err := qa.Status(ctx, id)
	require.NoError(t, err)
	deliver(&pricingv1.QuotePriced{QuoteId: "q-1"}, message.Meta{SagaID: id, CausationID: status.PendingMessageID})
	st, err = qa.Get(ctx, "q-1")
	require.NoError(t, err)
	require.Equal(t, quotev1.QuoteApprovalStateApproval, st.State)

	cancel := &quotev1.CancelQuote{QuoteId: "q-1", RequestedBy: "customer:c-1", Reason: "bought elsewhere"}
	var messageID string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		messageID, err = qa.CancelTx(ctx, tx, cancel, message.Meta{})
		return err
	}))
	var exchange, key, typ string
	require.NoError(t, pool.QueryRow(ctx, `SELECT exchange, routing_key, message_type FROM saga_outbox WHERE message_id = $1`, messageID).
		Scan(&exchange, &key, &typ))
	require.Equal(t, []string{"workflow.command", "command.quote.cancel-quote.v1", "quote.v1.CancelQuote"}, []string{exchange, key, typ})
	require.Contains(t, quotev1.Topology().Bindings, broker.Binding{Queue: qa.Queue(), Exchange: exchange, RoutingKey: key},
		"the saga's queue receives its cancel command")

	deliver(cancel, message.Meta{MessageID: messageID})
	st, err = qa.GetByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, quotev1.QuoteApprovalStateCompensatingPriceQuote, st.State)
	require.Equal(t, &sagadef.Cancellation{RequestedBy: "customer:c-1", Reason: "bought elsewhere", MessageID: messageID}, st.Cancel)
	history, err := qa.Engine().History(ctx, id)
	require.NoError(t, err)
	last := history[len(history)-1]
	require.Equal(t, "quote.v1.CancelQuote", last.Trigger)
	require.Equal(t, "customer:c-1", last.Operator)
	require.Equal(t, 1, strings.Count(last.Note, "bought elsewhere"), "the reason, once: %s", last.Note)

	_, err = qa.Cancel(ctx, &quotev1.CancelQuote{RequestedBy: "x", Reason: "y"}, message.Meta{})
	require.ErrorIs(t, err, saga.ErrNoCancel, "a cancel that names no quote is refused before the outbox")
}

// TestStatesMigrationRefusesOccupiedStates: a later definition without a
// state that live instances occupy is refused with a clear message.
func TestStatesMigrationRefusesOccupiedStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	src := orderv1.PlaceOrderMigrations()
	require.NoError(t, schema.Migrate(ctx, pool, src))
	_, err := pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data)
VALUES ('018f0000-0000-7000-8000-000000000001', 'o-9', 'APPROVE_ORDER', '\x')`)
	require.NoError(t, err)

	next := placeOrderFiles(t, func(string) bool { return true })
	var states string
	for name, f := range next {
		if strings.Contains(name, "_states_") {
			states = string(f.Data)
		}
	}
	require.NotEmpty(t, states)
	removed := strings.ReplaceAll(states, "'APPROVE_ORDER', ", "")
	require.NotEqual(t, states, removed)
	next["0003_states_without_approve_order.sql"] = &fstest.MapFile{Data: []byte(removed)}
	err = schema.Migrate(ctx, pool, schema.Source{Name: src.Name, FS: next})
	require.ErrorContains(t, err, "instances of saga_place_order are in states the new definition removes: APPROVE_ORDER")
}
