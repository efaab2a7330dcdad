package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/telemetry"
)

// RegisterGauges registers observable gauges of the runtime tables on
// meter, read from pool at each collection:
//
//   - saga.outbox.backlog: unpublished outbox rows;
//   - saga.outbox.oldest_age (s): how long the longest-waiting unpublished
//     row has been pending (saga_outbox_pending.pending_since: since it was
//     written, or since an operator's replay made it pending again), by the
//     database clock (0 when there is none); the same scan of the pending
//     rows gives the backlog;
//   - saga.parked.messages{messaging.destination.name}: open parked
//     messages (neither replayed nor dismissed), per original queue; a
//     queue whose parked messages are all closed is reported as 0.
func RegisterGauges(meter metric.Meter, pool *pgxpool.Pool, opts ...telemetry.GaugeOption) (metric.Registration, error) {
	if meter == nil || pool == nil {
		return nil, errors.New("register outbox gauges: meter and pool are required")
	}
	cfg := telemetry.NewGaugeConfig(opts...)
	backlog, err := meter.Int64ObservableGauge(telemetry.MetricOutboxBacklog, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows not yet published."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	age, err := meter.Float64ObservableGauge(telemetry.MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished outbox row."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	parkedGauge, err := meter.Int64ObservableGauge(telemetry.MetricParkedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Parked messages neither replayed nor dismissed, by original queue."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
		defer cancel()
		var (
			n    int64
			secs float64
		)
		err := pool.QueryRow(ctx, `
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(pending_since))::float8, 0) FROM saga_outbox_pending`).Scan(&n, &secs)
		if err != nil {
			return fmt.Errorf("measure outbox backlog: %w", err)
		}
		o.ObserveInt64(backlog, n)
		o.ObserveFloat64(age, max(secs, 0))
		// Every queue that has parked rows, open or not: one whose rows
		// were all replayed or dismissed is reported as 0, so an alert on
		// it clears (one read of the parking lot, which holds exceptions).
		counts, err := parked.CountByQueue(ctx, pool)
		if err != nil {
			return err
		}
		queues := make([]string, 0, len(counts))
		for q := range counts {
			queues = append(queues, q)
		}
		slices.Sort(queues)
		for _, q := range queues {
			o.ObserveInt64(parkedGauge, counts[q], metric.WithAttributes(attribute.String(string(telemetry.KeyDestinationName), q)))
		}
		return nil
	}, backlog, age, parkedGauge)
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	return reg, nil
}
