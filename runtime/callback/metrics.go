package callback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/telemetry"
)

// Metric names.
const (
	MetricDelivered = "saga.callback.delivered"
	MetricFailed    = "saga.callback.failed"
	MetricParked    = "saga.callback.parked"
	MetricLatency   = "saga.callback.latency"
	MetricPending   = "saga.callback.pending"
	MetricOldestAge = "saga.callback.oldest_age"
)

// metrics are a dispatcher's instruments; nil when metrics are disabled.
type metrics struct {
	deliveredN, failed, parkedN metric.Int64Counter
	latency                     metric.Float64Histogram
	reg                         metric.Registration
}

func newMetrics(p telemetry.Providers, pool *pgxpool.Pool) (*metrics, error) {
	if !p.MetricsEnabled() {
		return nil, nil
	}
	m := p.Meter.Meter(telemetry.ScopeName)
	var out metrics
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	out.deliveredN, err = m.Int64Counter(MetricDelivered, metric.WithUnit("{callback}"),
		metric.WithDescription("Callbacks acknowledged by their receiver (2xx)."))
	add(err)
	out.failed, err = m.Int64Counter(MetricFailed, metric.WithUnit("{attempt}"),
		metric.WithDescription("Callback attempts that failed, by error type (status code, timeout, network, refused)."))
	add(err)
	out.parkedN, err = m.Int64Counter(MetricParked, metric.WithUnit("{callback}"),
		metric.WithDescription("Callbacks parked: a permanent answer or a spent retry budget."))
	add(err)
	out.latency, err = m.Float64Histogram(MetricLatency, metric.WithUnit("s"),
		metric.WithDescription("Duration of one callback request, answered or not."))
	add(err)
	pending, err := m.Int64ObservableGauge(MetricPending, metric.WithUnit("{callback}"),
		metric.WithDescription("Callbacks neither delivered nor parked."))
	add(err)
	age, err := m.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest callback neither delivered nor parked."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if pool != nil {
		out.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var n int64
			var secs float64
			if err := pool.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
FROM saga_callback WHERE delivered_at IS NULL AND parked_at IS NULL`).Scan(&n, &secs); err != nil {
				return fmt.Errorf("measure callback backlog: %w", err)
			}
			o.ObserveInt64(pending, n)
			o.ObserveFloat64(age, max(secs, 0))
			return nil
		}, pending, age)
		if err != nil {
			return nil, err
		}
	}
	return &out, nil
}

func (m *metrics) close() error {
	if m == nil || m.reg == nil {
		return nil
	}
	return m.reg.Unregister()
}

var keyEvent = attribute.Key("saga.callback.event")

func (m *metrics) attempted(ctx context.Context, event string, a attempt, d time.Duration) {
	if m == nil {
		return
	}
	ev := keyEvent.String(event)
	m.latency.Record(ctx, d.Seconds(), metric.WithAttributes(ev))
	if a.Err == "" {
		return
	}
	kind := "network"
	switch {
	case a.Status != 0:
		kind = fmt.Sprint(a.Status)
	case a.Permanent:
		kind = "refused"
	}
	m.failed.Add(ctx, 1, metric.WithAttributes(ev, attribute.String("error.type", kind)))
}

func (m *metrics) delivered(ctx context.Context, event string) {
	if m != nil {
		m.deliveredN.Add(ctx, 1, metric.WithAttributes(keyEvent.String(event)))
	}
}

func (m *metrics) parked(ctx context.Context, event string) {
	if m != nil {
		m.parkedN.Add(ctx, 1, metric.WithAttributes(keyEvent.String(event)))
	}
}
