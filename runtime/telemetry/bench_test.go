package telemetry_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/telemetry"
)

// BenchmarkTransition measures one saga start and one reply applied to it
// (two transitions, two outbox rows with their create spans, two audit
// rows, plus a lookup of the pending command id) in one transaction, with telemetry off (zero Providers) and on (SDK
// tracer provider sampling everything into a batch processor with a
// discarding exporter, SDK meter provider with a manual reader). The reply
// runs under a consumer-like process span, as in production.
//
//	commit:   the transaction commits (what a consumer pays: one fsync)
//	rollback: it rolls back (the instrumentation's share without fsync noise)
//
// Besides ns/op it reports cpu-µs/op: this process's CPU time per
// operation (getrusage), which the database's own work does not blur.
//
// Run: source /tmp/saga-services/env.sh && go test -run '^$' -bench BenchmarkTransition -benchmem -count 6 ./runtime/telemetry/
func BenchmarkTransition(b *testing.B) {
	w := newWorld(b)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	modes := []struct {
		name string
		p    telemetry.Providers
	}{
		{"off", telemetry.Providers{}},
		{"on", telemetry.Providers{Tracer: tp, Meter: mp}},
	}
	for _, end := range []string{"commit", "rollback"} {
		for _, mode := range modes {
			eng := w.engine(mode.p, nil, nil)
			pool := w.pool()
			tracer := mode.p.TracerProvider().Tracer("bench")
			n := 0
			step := func(ctx context.Context) (string, error) {
				n++
				key := fmt.Sprintf("%s-%s-%d", end, mode.name, n)
				var id string
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					if id, _, err = eng.StartTx(ctx, tx, sagatest.NewMessage(tPlaceOrder, key), message.Meta{}); err != nil {
						return err
					}
					var pending string
					if err := tx.QueryRow(ctx, `SELECT pending_message_id::text FROM saga_tel_order WHERE id = $1`, id).Scan(&pending); err != nil {
						return err
					}
					m := sagatest.NewMessage(tReserved, key)
					env, err := message.New(m, message.Meta{SagaID: id, SagaType: w.def.Name, CausationID: pending})
					if err != nil {
						return err
					}
					pctx, span := tracer.Start(telemetry.Extract(ctx, &env), "process "+replyQueue, trace.WithSpanKind(trace.SpanKindConsumer))
					defer span.End()
					d := &consumer.Delivery{Envelope: env, Message: m, Queue: replyQueue, Attempt: 1, ReceivedAt: time.Now()}
					if err := eng.Handle(pctx, tx, d); err != nil {
						return err
					}
					if end == "rollback" {
						return errRollback
					}
					return nil
				})
				if err == errRollback {
					err = nil
				}
				return id, err
			}
			// The measured path really transitions.
			id, err := step(w.ctx)
			require.NoError(b, err)
			if end == "commit" {
				st, err := eng.Status(w.ctx, id)
				require.NoError(b, err)
				require.Equal(b, sagadef.StateName("Charge"), st.State)
			}
			b.Run(end+"/"+mode.name, func(b *testing.B) {
				b.ReportAllocs()
				cpu0 := processCPU(b)
				for b.Loop() {
					if _, err := step(w.ctx); err != nil {
						b.Fatal(err)
					}
				}
				// CPU time of this process (the application side; the
				// database server's work is not in it) per operation: far
				// less noisy than wall time on a shared machine.
				b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

var errRollback = fmt.Errorf("benchmark rollback")

// processCPU returns the user+system CPU time of this process so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
