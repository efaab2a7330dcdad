package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/telemetry"
	"github.com/protosaga/saga/runtime/telemetry/promexport"
)

func TestPropagationRoundTrip(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()

	var e message.Envelope
	require.True(t, telemetry.Inject(ctx, &e))
	sc := span.SpanContext()
	require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", e.Traceparent)

	got := trace.SpanContextFromContext(telemetry.Extract(context.Background(), &e))
	require.True(t, got.IsRemote())
	require.Equal(t, sc.TraceID(), got.TraceID())
	require.Equal(t, sc.SpanID(), got.SpanID())

	// Publishing carries it as the AMQP header of the same name.
	e.MessageID, e.MessageType, e.SchemaVersion = "m-1", "x.v1.T", 1
	require.Equal(t, e.Traceparent, e.Publishing().Headers[message.HeaderTraceparent])
}

func TestPropagationWithoutContext(t *testing.T) {
	t.Parallel()
	e := message.Envelope{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	require.False(t, telemetry.Inject(context.Background(), &e), "no span: the envelope keeps its context")
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", e.Traceparent)

	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		ctx := telemetry.ContextWithTraceparent(context.Background(), bad, "")
		require.False(t, trace.SpanContextFromContext(ctx).IsValid(), "traceparent %q", bad)
	}
	tp, ts := telemetry.TraceContext(context.Background())
	require.Empty(t, tp)
	require.Empty(t, ts)
}

func TestLogHandlerAddsIDsAndRedacts(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil), telemetry.LogOptions{}))

	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()
	ctx = telemetry.ContextWithMessage(ctx, &message.Envelope{
		SagaID: "s-1", SagaType: "x.v1.Order", MessageID: "m-1", MessageType: "x.v1.Reply", CorrelationID: "c-1", CausationID: "k-1",
	})
	log.With("db_password", "hunter2").InfoContext(ctx, "handled",
		"saga_id", "explicit", // a record's own value wins
		"body", []byte("secret payload"),
		"raw", []byte("card 4111"),
		"msg_value", wrapperspb.String("4111 1111 1111 1111"),
		slog.Group("request", "authorization", "Bearer abc", "path", "/orders"),
		"api_token", "t0k3n")

	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec))
	require.Equal(t, "explicit", rec["saga_id"])
	require.Equal(t, "x.v1.Order", rec["saga_type"])
	require.Equal(t, "m-1", rec["message_id"])
	require.Equal(t, "x.v1.Reply", rec["message_type"])
	require.Equal(t, "c-1", rec["correlation_id"])
	require.Equal(t, "k-1", rec["causation_id"])
	require.Equal(t, span.SpanContext().TraceID().String(), rec["trace_id"])
	require.Equal(t, span.SpanContext().SpanID().String(), rec["span_id"])
	require.Equal(t, telemetry.Redacted, rec["db_password"])
	require.Equal(t, telemetry.Redacted, rec["body"])
	require.Equal(t, "[9 bytes]", rec["raw"])
	require.Equal(t, "[message google.protobuf.StringValue]", rec["msg_value"])
	require.Equal(t, map[string]any{"authorization": telemetry.Redacted, "path": "/orders"}, rec["request"])
	require.Equal(t, telemetry.Redacted, rec["api_token"])
	for _, secret := range []string{"hunter2", "secret payload", "4111", "Bearer", "t0k3n"} {
		require.NotContains(t, buf.String(), secret)
	}

	// Without a context nothing is added.
	buf.Reset()
	log.Info("plain")
	require.NotContains(t, buf.String(), "trace_id")
	require.NotContains(t, buf.String(), "message_id")
}

// TestDisabledIsFree checks that the zero Providers records nothing at no
// allocation cost.
func TestDisabledIsFree(t *testing.T) {
	m, err := telemetry.NewMetrics(telemetry.Providers{})
	require.NoError(t, err)
	require.False(t, m.Enabled())
	def := orderDefinition(t)
	res := sagadef.Result{Class: sagadef.ClassNew, To: sagadef.StateManualReview}
	labels := telemetry.ConsumerAttributes("c", "q")
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		m.Transition(ctx, def, sagadef.TriggerTimeout, "RESERVE", res)
		m.StepLatency(ctx, def.Name, "Charge", telemetry.PhaseForward, time.Millisecond)
		m.Consumed(ctx, labels, 1)
		m.Settled(ctx, labels, "processed", time.Millisecond)
		m.Sent(ctx, "x", "", time.Millisecond)
	})
	require.Zero(t, allocs)
}

func TestPrometheusExposition(t *testing.T) {
	t.Parallel()
	res, err := promexport.ServiceResource("orders-test")
	require.NoError(t, err)
	prom, err := promexport.New(res)
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.Shutdown(context.Background()) })
	m, err := telemetry.NewMetrics(telemetry.Providers{Meter: prom.MeterProvider()})
	require.NoError(t, err)
	def := orderDefinition(t)
	ctx := context.Background()
	emit := []sagadef.Outgoing{{Message: sagatest.NewMessage(tRelease, "k")}}
	m.Transition(ctx, def, sagadef.TriggerTimeout, sagadef.StateName("Reserve"), sagadef.Result{Class: sagadef.ClassNew, Emit: emit})
	m.StepLatency(ctx, def.Name, "Charge", telemetry.PhaseForward, 3*time.Millisecond)
	m.Sent(ctx, "shop.commands", "nacked", 0)
	m.Sent(ctx, "shop.commands", "", time.Second)
	labels := telemetry.ConsumerAttributes("orders", "shop.replies")
	m.Settled(ctx, labels, "park", time.Millisecond)
	m.Parked(ctx, labels, "permanent", "unknown_type")

	srv := httptest.NewServer(prom.MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	text := string(body)
	for _, want := range []string{
		`saga_transitions_total{otel_scope_name="github.com/protosaga/saga/runtime",otel_scope_schema_url="",otel_scope_version="",saga_result="applied",saga_trigger_type="timeout",saga_type="tel.v1.Order"} 1`,
		`saga_timeouts_total{`,
		`saga_compensations_total{`,
		`saga_step_latency_seconds_bucket{`,
		`messaging_client_sent_messages_total{error_type="nacked",messaging_destination_name="shop.commands",messaging_operation_name="publish",messaging_system="rabbitmq"`,
		`saga_outbox_publish_delay_seconds_count{`,
		`saga_consumer_messages_total{`,
		`messaging_process_duration_seconds_bucket{`,
		`saga_consumer_parked_total{`,
		// The service, by name, and the Go runtime's and the process's metrics.
		`target_info{service_name="orders-test",`,
		`go_goroutines `,
		`go_memstats_heap_alloc_bytes `,
		`process_resident_memory_bytes `,
		`process_open_fds `,
	} {
		require.True(t, strings.Contains(text, want), "exposition lacks %s:\n%s", want, text)
	}
	require.NotContains(t, text, "unknown_service")
}
