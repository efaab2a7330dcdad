package telemetry

import (
	"log/slog"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every tracer and meter the
// runtime creates.
const ScopeName = "github.com/protosaga/saga/runtime"

// Providers are the telemetry back ends of one runtime component. The zero
// value disables instrumentation (no-op, at the cost of a nil check); each
// field can be set alone.
type Providers struct {
	// Tracer creates spans; nil disables tracing (the trace context is
	// still passed through from message to message).
	Tracer trace.TracerProvider
	// Meter creates instruments; nil disables metrics.
	Meter metric.MeterProvider
	// Logger is the component's logger when its own Config.Logger is nil.
	// Wrap its handler with [NewLogHandler] to get trace and message ids in
	// every record.
	Logger *slog.Logger
}

// TracingEnabled reports whether p creates spans.
func (p Providers) TracingEnabled() bool { return p.Tracer != nil }

// MetricsEnabled reports whether p records metrics.
func (p Providers) MetricsEnabled() bool { return p.Meter != nil }

// TracerProvider returns p.Tracer, or a no-op provider.
func (p Providers) TracerProvider() trace.TracerProvider {
	if p.Tracer == nil {
		return tracenoop.NewTracerProvider()
	}
	return p.Tracer
}

// MeterProvider returns p.Meter, or a no-op provider.
func (p Providers) MeterProvider() metric.MeterProvider {
	if p.Meter == nil {
		return metricnoop.NewMeterProvider()
	}
	return p.Meter
}

// RuntimeTracer returns the runtime's tracer from p (a no-op tracer when
// tracing is disabled).
func (p Providers) RuntimeTracer() trace.Tracer {
	return p.TracerProvider().Tracer(ScopeName)
}

// LoggerOr returns own when it is set, then p.Logger, then def.
func (p Providers) LoggerOr(own, def *slog.Logger) *slog.Logger {
	switch {
	case own != nil:
		return own
	case p.Logger != nil:
		return p.Logger
	default:
		return def
	}
}
