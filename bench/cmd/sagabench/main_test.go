package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/bench/internal/benv"
)

// TestQuick runs the whole benchmark in its smoke configuration against the
// real servers, so the measurements keep compiling and keep working: every
// measurement must succeed (each Watermill and runtime saga completes, the
// relay publishes every row) and the table must list every group.
func TestQuick(t *testing.T) {
	for _, v := range []string{benv.EnvPostgresURL, benv.EnvAMQPURL, benv.EnvRabbitAPI} {
		if os.Getenv(v) == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set: run under scripts/with-services.sh", v)
			}
			t.Skipf("%s is not set: source /tmp/saga-services/env.sh (or run under scripts/with-services.sh)", v)
		}
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-quick"}, &out, &errOut)
	require.NoError(t, err, "stderr:\n%s\nstdout:\n%s", errOut.String(), out.String())
	table := out.String()
	for _, want := range []string{
		"| raw RabbitMQ | publish persistent 300 B, confirms window 256, quorum queue | msgs/s |",
		"| raw RabbitMQ | consume+ack, quorum queue, prefetch 500 | msgs/s |",
		"| raw PostgreSQL | pgbench saga-step transaction, 4 clients | commits/s |",
		"| saga throughput | Watermill, 8 handlers, 150 sagas | sagas/s |",
		"| saga throughput | saga runtime, workers 4, 300 sagas | sagas/s |",
		"| saga throughput | saga runtime, workers 4, 300 sagas | commits/step |",
		"| saga throughput | saga runtime, workers 4, 300 sagas | statements/saga (executed) |",
		"| saga throughput | Watermill, 8 handlers, 150 sagas | statements/saga (executed) |",
		"| saga throughput | saga runtime, workers 4, 300 sagas | total CPU ms/saga (client + PostgreSQL + RabbitMQ) |",
		"| relay | raw publish of the relay's messages (same headers, exchange, routing key, mandatory, window 1024), 2000 msgs | msgs/s |",
		"/ raw publish of the same messages (same shape)",
		"| relay | outbox relay ×1 (batch 500, window 1024: defaults), 2000 rows | msgs/s |",
		"ours / Watermill (completed sagas/s)",
	} {
		require.True(t, strings.Contains(table, want), "table lacks %q:\n%s", want, table)
	}
	// The offered rate of the latency run follows the measured capacity, so
	// the row is matched without it.
	require.Regexp(t, `\| latency \| saga runtime, workers 4, [0-9.]+ sagas/s offered \| step p99 ms \| [0-9.]+ \|`, table)
	require.NotContains(t, table, "% of sagas completed within the limit", "a quick run must complete every saga")
}
