package broker_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
)

// TestConnCountsReconnects: every lost and re-established connection adds one
// to saga.broker.reconnects, labelled with the connection's name.
func TestConnCountsReconnects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	url := testenv.AMQP(t)
	conn, err := broker.Dial(ctx, url, broker.ConnConfig{Name: "counted", Meter: provider, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	reconnects := func() int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != broker.MetricReconnects {
					continue
				}
				var n int64
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					name, _ := dp.Attributes.Value("saga.connection.name")
					require.Equal(t, "counted", name.AsString())
					n += dp.Value
				}
				return n
			}
		}
		return 0
	}
	require.Zero(t, reconnects(), "dialing is not a reconnect")
	for want := int64(1); want <= 2; want++ {
		ch, err := conn.Channel(ctx)
		require.NoError(t, err)
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		testenv.KillAMQPConnectionsUntil(t, url, closed)
		_, err = conn.Channel(ctx) // waits for the reconnect
		require.NoError(t, err)
		require.Eventually(t, func() bool { return reconnects() == want }, 20*time.Second, 20*time.Millisecond)
	}
}
