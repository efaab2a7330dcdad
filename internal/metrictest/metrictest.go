// Package metrictest reads the runtime's OpenTelemetry metrics in tests.
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
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

// Point is one data point of a metric: for counters and gauges Value is
// its value, for histograms Value is the count of recorded values and Sum
// their sum.
type Point struct {
	Attrs attribute.Set
	Value float64
	Sum   float64
}

// Matches reports whether the point carries every label of labels (as the
// attribute's string form).
func (p Point) Matches(labels map[string]string) bool {
	for k, v := range labels {
		got, ok := p.Attrs.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// Points collects the metrics and returns the data points of the metric
// named name.
func (p *Provider) Points(t testing.TB, name string) []Point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("metrictest: collect: %v", err)
	}
	var out []Point
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, Point{Attrs: dp.Attributes, Value: float64(dp.Value)})
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, Point{Attrs: dp.Attributes, Value: float64(dp.Value)})
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, Point{Attrs: dp.Attributes, Value: dp.Value})
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, Point{Attrs: dp.Attributes, Value: float64(dp.Count), Sum: dp.Sum})
				}
			default:
				t.Fatalf("metrictest: metric %s: unexpected data %T", name, m.Data)
			}
		}
	}
	return out
}

// Value adds up the values (histograms: the counts) of the points of name
// that carry labels.
func (p *Provider) Value(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	var v float64
	for _, pt := range p.Points(t, name) {
		if pt.Matches(labels) {
			v += pt.Value
		}
	}
	return v
}

// Sum collects the metrics and returns the total of the int64 counter
// named name over all its data points (0 when it has recorded nothing).
func (p *Provider) Sum(t testing.TB, name string) int64 {
	t.Helper()
	return int64(p.Value(t, name, nil))
}

// Has reports whether name has a point that carries labels.
func (p *Provider) Has(t testing.TB, name string, labels map[string]string) bool {
	t.Helper()
	for _, pt := range p.Points(t, name) {
		if pt.Matches(labels) {
			return true
		}
	}
	return false
}
