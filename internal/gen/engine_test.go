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

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/saga"
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
	require.Equal(t, orderv1.PlaceOrderStateReserveInventory, st.State)
	require.Equal(t, "o-1", st.BusinessKey)

	var outbox int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_outbox WHERE message_type = 'shop.inventory.v1.ReserveInventory'`).Scan(&outbox))
	require.Equal(t, 1, outbox, "one command for two starts")

	_, err = pool.Exec(ctx, `UPDATE saga_place_order SET state = 'NOT_A_STATE'`)
	require.ErrorContains(t, err, "saga_place_order_state_check")
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
