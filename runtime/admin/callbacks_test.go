package admin_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/callback"
)

// enqueueCallback writes a callback for the saga, as its outcome would.
func (b *bundle) enqueueCallback(t *testing.T, sagaID, url string) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return callback.EnqueueTx(context.Background(), tx, callback.Delivery{URL: url, Payload: callback.Payload{
			CallbackID: id, SagaID: sagaID, SagaType: "shop.order.v1.PlaceOrder", Event: "saga.completed", State: "COMPLETED"}})
	}))
	return id
}

func TestCallbacksListedPerSagaAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sagaID := b.start(t, "order-cb-1")
	other := b.start(t, "order-cb-2")
	pending := b.enqueueCallback(t, sagaID, "https://client.example/hooks")
	parked := b.enqueueCallback(t, sagaID, "ftp://client.example/hooks") // refused at once
	b.enqueueCallback(t, other, "https://client.example/hooks")

	list := getJSON[admin.CallbackList](t, b, "/api/callbacks?saga="+sagaID)
	require.Len(t, list.Callbacks, 2)
	byID := map[string]admin.Callback{}
	for _, c := range list.Callbacks {
		require.Equal(t, sagaID, c.SagaID)
		byID[c.ID] = c
	}
	require.Equal(t, callback.StatusPending, byID[pending].Status)
	require.NotNil(t, byID[pending].NextAttemptAt)
	require.Equal(t, callback.StatusParked, byID[parked].Status)
	require.Contains(t, byID[parked].ParkReason, "want an absolute http or https URL")

	onlyParked := getJSON[admin.CallbackList](t, b, "/api/callbacks?status=parked")
	require.Len(t, onlyParked.Callbacks, 1)
	require.Equal(t, parked, onlyParked.Callbacks[0].ID)

	// Reading needs the read role; replaying the repair role and a reason.
	code, _ := b.call(t, readToken, http.MethodPost, "/api/callbacks/"+parked+"/replay", map[string]string{"reason": "fixed"})
	require.Equal(t, http.StatusForbidden, code)
	code, raw := b.call(t, repairToken, http.MethodPost, "/api/callbacks/"+parked+"/replay", map[string]string{})
	require.Equal(t, http.StatusBadRequest, code, string(raw))
	code, _ = b.call(t, repairToken, http.MethodPost, "/api/callbacks/"+pending+"/replay", map[string]string{"reason": "again"})
	require.Equal(t, http.StatusConflict, code, "only a parked delivery is replayed")
	code, _ = b.call(t, repairToken, http.MethodPost, "/api/callbacks/"+uuid.NewString()+"/replay", map[string]string{"reason": "x"})
	require.Equal(t, http.StatusNotFound, code)
	code, _ = b.call(t, repairToken, http.MethodGet, "/api/callbacks?status=lost", nil)
	require.Equal(t, http.StatusBadRequest, code)

	res := postJSON[admin.CallbackReplayResult](t, b, "/api/callbacks/"+parked+"/replay",
		map[string]string{"reason": "the client fixed its URL"}, http.StatusOK)
	require.Equal(t, "alice", res.Operator)
	require.Equal(t, callback.StatusPending, res.Callback.Status)
	require.Zero(t, res.Callback.Attempts)
	audit, err := callback.Audit(context.Background(), b.pool, parked)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "alice", audit[0].Operator)
	require.Equal(t, "the client fixed its URL", audit[0].Reason)
}
