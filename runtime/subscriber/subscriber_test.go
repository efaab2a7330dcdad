package subscriber_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/subscriber"
)

func TestHandlerPassesTheEventAndItsConversation(t *testing.T) {
	t.Parallel()
	ev := sagatest.NewMessage(sagatest.NewType("test.Event", message.KindEvent), "e-1")
	d := &consumer.Delivery{Message: ev, Envelope: message.Envelope{
		MessageID: "m-1", MessageType: "test.Event", CorrelationID: "c-1", SagaID: "s-1", SagaType: "T", Traceparent: "tp",
	}}
	var got message.Meta
	h := subscriber.Handler("mailer", func(ctx context.Context, _ pgx.Tx, e message.Message) error {
		require.Same(t, ev, e)
		got = subscriber.Meta(ctx)
		return nil
	})
	require.NoError(t, h(context.Background(), nil, d))
	require.Equal(t, message.Meta{CorrelationID: "c-1", CausationID: "m-1", SagaID: "s-1", SagaType: "T", Traceparent: "tp"}, got)
	require.Equal(t, message.Meta{}, subscriber.Meta(context.Background()), "outside a handler")

	boom := errors.New("boom")
	err := subscriber.Handler("mailer", func(context.Context, pgx.Tx, message.Message) error { return boom })(context.Background(), nil, d)
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "subscriber mailer: handle test.Event m-1")

	err = h(context.Background(), nil, &consumer.Delivery{})
	require.True(t, retry.ClassOf(err) == retry.ClassPermanent, "an undecoded delivery is parked: %v", err)
}

func TestUnexpectedEventIsPermanent(t *testing.T) {
	t.Parallel()
	err := subscriber.UnexpectedEvent("ledger", sagatest.NewMessage(sagatest.NewType("test.Other", message.KindEvent), "x"))
	require.True(t, retry.ClassOf(err) == retry.ClassPermanent)
	require.ErrorContains(t, err, "subscriber ledger: unexpected event test.Other")
}
