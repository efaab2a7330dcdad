package saga_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/apipb"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/schema"
)

// callbackHooks keep the saga data in a google.protobuf.Api: name is the
// order id, version the callback URL the request registered (the order id
// after "url-" when it starts so, none otherwise).
type callbackHooks struct{}

func (callbackHooks) Start(_ context.Context, start message.Message) (proto.Message, string, error) {
	order := start.(testMsg).GetValue()
	api := &apipb.Api{Name: order}
	if len(order) > 4 && order[:4] == "url-" {
		api.Version = "https://client.example/" + order[4:]
	}
	return api, order, nil
}

func (callbackHooks) Build(_ context.Context, command string, data proto.Message) (message.Message, error) {
	in, _ := testRegistry.Lookup(command)
	m := in.New().(testMsg)
	m.Value = data.(*apipb.Api).GetName()
	return m, nil
}

func (callbackHooks) Apply(context.Context, proto.Message, message.Message) error { return nil }

func callbackBundle(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	def := placeOrder(t, "saga_place_order", defOptions{})
	def.DataMessage = "google.protobuf.Api"
	def.Callback = sagadef.Callback{States: []string{sagadef.StateCompleted, sagadef.StateFailed}, URLField: "version", IncludeData: true}
	testenv.CreateSagaTable(t, pool, def)
	b := &testBundle{pool: pool, clock: &clock{now: baseTime}, def: def}
	b.engine = b.newEngine(t, func(c *saga.Config) {
		c.Hooks = callbackHooks{}
		c.NewData = func() proto.Message { return &apipb.Api{} }
	})
	return b
}

func (b *testBundle) callbacks(t *testing.T, sagaID string) []callback.Record {
	t.Helper()
	list, err := callback.List(context.Background(), b.pool, callback.Filter{SagaID: sagaID})
	require.NoError(t, err)
	return list
}

func TestOutcomeWritesItsCallbackInTheTransition(t *testing.T) {
	t.Parallel()
	b := callbackBundle(t)
	id := b.start(t, "url-o1")
	b.mustReply(t, id, msgInventoryReserved)
	b.mustReply(t, id, msgPaymentAuthorized)
	require.Empty(t, b.callbacks(t, id), "no callback before an outcome")
	b.mustReply(t, id, msgShippingScheduled)

	list := b.callbacks(t, id)
	require.Len(t, list, 1)
	r := list[0]
	require.Equal(t, callback.StatusPending, r.Status)
	require.Equal(t, "https://client.example/o1", r.URL)
	require.Equal(t, "saga.completed", r.Event)
	var p callback.Payload
	require.NoError(t, json.Unmarshal(r.Body, &p))
	require.Equal(t, r.ID, p.CallbackID)
	require.Equal(t, id, p.SagaID)
	require.Equal(t, "url-o1", p.BusinessKey)
	require.Equal(t, sagadef.StateCompleted, p.State)
	require.Equal(t, sagaTypeName, p.SagaType)
	require.Equal(t, baseTime, p.OccurredAt)
	require.JSONEq(t, `{"name":"url-o1","version":"https://client.example/o1"}`, string(p.Data))

	// A second answer to the last command changes nothing and writes nothing.
	out := b.outbox(t, id)
	_, err := b.reply(t, id, msg(msgShippingScheduled, "url-o1"), out[len(out)-1].MessageID)
	require.NoError(t, err)
	require.Len(t, b.callbacks(t, id), 1)
}

func TestFailedOutcomeAndSagaWithoutURL(t *testing.T) {
	t.Parallel()
	b := callbackBundle(t)
	id := b.start(t, "url-o2")
	b.mustReply(t, id, msgInventoryReserved)
	b.mustReply(t, id, msgPaymentDeclined)
	require.Empty(t, b.callbacks(t, id), "compensating is not an outcome")
	b.mustReply(t, id, msgInventoryReleased)
	list := b.callbacks(t, id)
	require.Len(t, list, 1)
	require.Equal(t, "saga.failed", list[0].Event)

	none := b.start(t, "o3") // registered no URL
	b.mustReply(t, none, msgInventoryFailed)
	require.Equal(t, sagadef.StateFailed, b.status(t, none).State)
	require.Empty(t, b.callbacks(t, none))
}
