package host_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
)

// TestHostStartsOnLegacyWorkQueues: work queues that exist without the
// dead-letter arguments this runtime declares (an earlier version declared
// them) do not stop the host: it declares them as they are, starts, and
// warns once per queue with the policy that gives it the dead-lettering.
func TestHostStartsOnLegacyWorkQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amqpURL := testenv.AMQP(t)
	logs := &testenv.LogBuffer{}
	h, err := host.New(ctx, host.Config{
		Service: "legacy-test", Pool: testenv.Postgres(t), AMQPURL: amqpURL, HTTPAddr: host.HTTPOff,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	require.NoError(t, err)
	_, err = app.Register(h)
	require.NoError(t, err)

	old := h.Topology()
	old.Queues = append([]broker.Queue(nil), old.Queues...)
	var legacy []string
	for i, q := range old.Queues {
		if q.Args[broker.ArgDeadLetterRoutingKey] == broker.ParkingQueue(q.Name) {
			old.Queues[i].Args = nil
			legacy = append(legacy, q.Name)
		}
	}
	require.NotEmpty(t, legacy)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, ch, old))

	require.NoError(t, h.Start(ctx))
	require.NoError(t, h.Stop(ctx))
	out := logs.String()
	for _, q := range legacy {
		require.Contains(t, out, `"queue":"`+q+`"`, "no warning for %s", q)
		require.Contains(t, out, strings.ReplaceAll(broker.LegacyWorkQueuePolicy(q), `"`, `\"`))
	}
	require.Equal(t, len(legacy), strings.Count(out, "without the dead-letter arguments"))
}
