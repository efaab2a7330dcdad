package consumer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/telemetry"
)

// TestRolledBackAttemptIsMarked: when a handler fails on the fast path,
// the batch rolls back and is applied again with a savepoint per delivery.
// A delivery whose handler had run in the rolled-back attempt gets a new
// process span for the attempt that commits, and its first one says
// saga.consumer.outcome=rolled_back, so the spans under it (which ended
// looking successful) are known not to have committed.
func TestRolledBackAttemptIsMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r := b.start(func(c *consumer.Config) {
		c.Concurrency, c.BatchSize = 1, 16
		c.Telemetry = telemetry.Providers{Tracer: tp}
	}, nil)
	b.sendOneBatch(r, [2]string{"ok1", doOK}, [2]string{"flaky", doTransientOnce}, [2]string{"ok2", doOK})
	b.waitSettled("ok1", "done")
	b.waitSettled("ok2", "done")
	b.waitSettled("flaky", "done")
	b.stop(r)
	_, fellBack := consumer.Paths(r.c)
	require.NotZero(t, fellBack, "the fast path rolled back")

	outcomes := map[string][]string{}
	for _, s := range exp.GetSpans() {
		var id, outcome string
		for _, a := range s.Attributes {
			switch a.Key {
			case telemetry.KeyMessageID:
				id = a.Value.AsString()
			case telemetry.KeyConsumerOutcome:
				outcome = a.Value.AsString()
			}
		}
		outcomes[id] = append(outcomes[id], outcome)
	}
	require.ElementsMatch(t, []string{"rolled_back", "processed"}, outcomes["ok1"], "ran, rolled back, ran again")
	require.Equal(t, []string{"processed"}, outcomes["ok2"], "never ran in the rolled-back attempt")
	require.ElementsMatch(t, []string{"retry", "processed"}, outcomes["flaky"], "its failure, then its retry")
}
