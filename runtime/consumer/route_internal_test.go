package consumer

import (
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// A message without an id is parked under one derived from what it
// carries: the same for every delivery of it, different for another
// message.
func TestParkIDForMessagesWithoutOne(t *testing.T) {
	delivery := func() *amqp.Delivery {
		return &amqp.Delivery{
			Exchange: "shop", RoutingKey: "order.placed", Type: "shop.v1.OrderPlaced", CorrelationId: "corr",
			Timestamp: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
			Headers:   amqp.Table{"x-saga-id": "s-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			Body:      []byte("payload"),
		}
	}
	first := parkIDFor("orders", delivery())
	_, err := uuid.Parse(first)
	require.NoError(t, err)

	again := delivery()
	again.Redelivered = true
	again.DeliveryTag = 7
	again.Headers[headerDeliveryCount] = int64(2)
	again.Headers["x-death"] = []any{amqp.Table{"queue": "orders", "count": int64(1)}}
	require.Equal(t, first, parkIDFor("orders", again), "a redelivery is parked under another id")

	for name, change := range map[string]func(d *amqp.Delivery){
		"body":           func(d *amqp.Delivery) { d.Body = []byte("other") },
		"header":         func(d *amqp.Delivery) { d.Headers["x-saga-id"] = "s-2" },
		"routing key":    func(d *amqp.Delivery) { d.RoutingKey = "order.cancelled" },
		"correlation id": func(d *amqp.Delivery) { d.CorrelationId = "corr-2" },
		"timestamp":      func(d *amqp.Delivery) { d.Timestamp = d.Timestamp.Add(time.Second) },
	} {
		other := delivery()
		change(other)
		require.NotEqual(t, first, parkIDFor("orders", other), name)
	}
	require.NotEqual(t, first, parkIDFor("payments", delivery()), "queue")
}
