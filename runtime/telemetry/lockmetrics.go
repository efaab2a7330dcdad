package telemetry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names of runtime/lock; docs/observability.md lists types, units
// and labels.
const (
	MetricLockWait = "saga.lock.wait"
	MetricLockHold = "saga.lock.hold"
)

// Attributes of the lock metrics.
const (
	// KeyLockBackend is the lock implementation: "postgres" or "redis".
	KeyLockBackend = attribute.Key("saga.lock.backend")
	// KeyLockOutcome is how a wait ended (acquired, held, canceled, error)
	// or a hold ended (released, lost).
	KeyLockOutcome = attribute.Key("saga.lock.outcome")
)

// Outcomes of a lock wait ([LockMetrics.Waited]) and of a hold
// ([LockMetrics.Held]).
const (
	LockAcquired = "acquired"
	LockHeld     = "held"
	LockCanceled = "canceled"
	LockError    = "error"
	LockReleased = "released"
	LockLost     = "lost"
)

// LockMetrics holds the instruments of runtime/lock. Recording methods are
// no-ops on a LockMetrics made from a disabled Providers, and safe on a nil
// *LockMetrics.
type LockMetrics struct {
	enabled    bool
	wait, hold metric.Float64Histogram
}

// NewLockMetrics creates the lock instruments from p.Meter. With metrics
// disabled it returns a LockMetrics whose methods do nothing.
func NewLockMetrics(p Providers) (*LockMetrics, error) {
	if !p.MetricsEnabled() {
		return &LockMetrics{}, nil
	}
	m := p.Meter.Meter(ScopeName)
	wait, err1 := m.Float64Histogram(MetricLockWait, metric.WithUnit(metricSecondsUnit),
		metric.WithDescription("From a lock requested to the request's end: acquired, held by another owner (try), canceled or failed."),
		metric.WithExplicitBucketBoundaries(durationBounds...))
	hold, err2 := m.Float64Histogram(MetricLockHold, metric.WithUnit(metricSecondsUnit),
		metric.WithDescription("From a lease acquired to its end: released by its owner, or found lost (expired or taken)."),
		metric.WithExplicitBucketBoundaries(durationBounds...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("create lock instruments: %w", err)
	}
	return &LockMetrics{enabled: true, wait: wait, hold: hold}, nil
}

// Waited records how long a lock request took and how it ended.
func (m *LockMetrics) Waited(ctx context.Context, backend, outcome string, d time.Duration) {
	if m == nil || !m.enabled {
		return
	}
	m.wait.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(KeyLockBackend.String(backend), KeyLockOutcome.String(outcome)))
}

// Held records how long a lease was held and how the hold ended.
func (m *LockMetrics) Held(ctx context.Context, backend, outcome string, d time.Duration) {
	if m == nil || !m.enabled {
		return
	}
	m.hold.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(KeyLockBackend.String(backend), KeyLockOutcome.String(outcome)))
}
