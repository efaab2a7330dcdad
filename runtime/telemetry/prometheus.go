package telemetry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Prometheus is a MeterProvider whose metrics are served in the Prometheus
// exposition format from a registry of its own (never the global default
// registry). Create one per process, pass [Prometheus.MeterProvider] as
// Providers.Meter to every component and mount [Prometheus.MetricsHandler]
// at /metrics.
type Prometheus struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// NewPrometheus returns a Prometheus provider. res describes the process
// (service.name, ...); nil uses the SDK's default resource. Metric names
// are translated by the exporter: dots become underscores, units and
// _total are appended (saga.transitions → saga_transitions_total).
func NewPrometheus(res *resource.Resource) (*Prometheus, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	if res != nil {
		opts = append(opts, sdkmetric.WithResource(res))
	}
	return &Prometheus{
		provider: sdkmetric.NewMeterProvider(opts...),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
	}, nil
}

// MeterProvider returns the provider to put in Providers.Meter.
func (p *Prometheus) MeterProvider() metric.MeterProvider { return p.provider }

// MetricsHandler serves the metrics (GET /metrics). Every scrape runs the
// observable gauges' callbacks, i.e. their database queries.
func (p *Prometheus) MetricsHandler() http.Handler { return p.handler }

// Shutdown stops the provider; later scrapes return no runtime metrics.
func (p *Prometheus) Shutdown(ctx context.Context) error {
	if err := p.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut down prometheus meter provider: %w", err)
	}
	return nil
}
