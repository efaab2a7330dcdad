// Package metrictest reads the runtime's OpenTelemetry metrics in tests.
package metrictest

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Provider is a meter provider whose metrics a test collects on demand. It
// is shut down when the test ends.
type Provider struct {
	*sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

// New returns a Provider for t.
func New(t testing.TB) *Provider {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Provider{MeterProvider: mp, reader: reader}
}

// Sum collects the metrics and returns the total of the int64 counter
// named name over all its data points (0 when it has recorded nothing).
func (p *Provider) Sum(t testing.TB, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("metrictest: collect: %v", err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}
