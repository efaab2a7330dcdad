package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/saga"
)

// TestOperatorFixesCauseAndReplaysParkedMessage is the operator's story end to
// end: an order ships to a country no carrier serves; the shipping command is
// parked at once (a permanent error: retrying cannot help) and the saga waits
// in SCHEDULE_SHIPPING. A replay before the fix is parked again; after the
// operator adds the carrier, a replay through the admin API (same message id,
// saga state checked, audited with who and why) books the shipment once and
// the saga completes.
func TestOperatorFixesCauseAndReplaysParkedMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const orderID = "o-iceland"
	req := request(orderID)
	req.ShippingAddress.Country = "IS"
	id := b.start(t, req)
	b.waitState(t, id, orderv1.PlaceOrderStateScheduleShipping)

	schedule := shippingv1.ScheduleShippingInfo.FullName
	var parkedID int64
	var reason string
	eventually(t, "the shipping command to be parked", func() bool {
		return b.pool.QueryRow(ctx, `SELECT id, reason FROM saga_parked WHERE saga_id = $1 AND message_type = $2 AND replayed_at IS NULL`,
			id, schedule).Scan(&parkedID, &reason) == nil
	})
	require.Contains(t, reason, `no carrier serves country "IS"`)
	require.Equal(t, 1, b.script.Deliveries(orderID, schedule), "a permanent error is parked at once, not retried")

	tokens, err := admin.ParseTokens("olga:repair:0123456789abcdef0123456789abcdef")
	require.NoError(t, err)
	srv, err := admin.New(admin.Config{Pool: b.pool, Sagas: []*saga.Engine{b.placeOrder.Engine()}, Tokens: tokens})
	require.NoError(t, err)
	api := httptest.NewServer(srv)
	defer api.Close()
	replay := func(parked int64, why string) admin.ReplayResult {
		t.Helper()
		body, err := json.Marshal(admin.ReplayRequest{Reason: why})
		require.NoError(t, err)
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/api/parked/%d/replay", api.URL, parked), bytes.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("Authorization", "Bearer 0123456789abcdef0123456789abcdef")
		r.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var res admin.ReplayResult
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&res))
		return res
	}

	// Replaying before fixing the cause parks the message again.
	first := replay(parkedID, "try again before the fix")
	require.Equal(t, admin.OutcomeReplayed, first.Outcome)
	var again int64
	eventually(t, "the premature replay to be parked again", func() bool {
		return b.pool.QueryRow(ctx, `SELECT id FROM saga_parked WHERE saga_id = $1 AND message_type = $2 AND replayed_at IS NULL`,
			id, schedule).Scan(&again) == nil
	})
	require.NotEqual(t, parkedID, again)
	require.Equal(t, orderv1.PlaceOrderStateScheduleShipping, b.waitState(t, id, orderv1.PlaceOrderStateScheduleShipping).State)

	// The operator fixes the cause, then replays.
	_, err = b.pool.Exec(ctx, `INSERT INTO shipping_carriers (country, carrier) VALUES ('IS', 'Norðurpóstur')`)
	require.NoError(t, err)
	res := replay(again, "carrier for IS added (ticket OPS-42)")
	require.Equal(t, admin.OutcomeReplayed, res.Outcome)
	require.Equal(t, first.MessageID, res.MessageID, "a replay keeps the message id")

	b.waitState(t, id, orderv1.PlaceOrderStateCompleted)
	require.Equal(t, []string{"inventory:reserved", "payment:authorized", "shipping:booked", "order:approved"}, b.ledger(t, orderID))
	var replays int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM saga_audit WHERE saga_id = $1 AND trigger = $2 AND operator = 'olga'`,
		id, admin.TriggerReplay).Scan(&replays))
	require.Equal(t, 2, replays, "each replay is in the saga's audit trail with who")
}
