// Package promexport serves the runtime's metrics in the Prometheus exposition
// format. It is the only runtime package that links the OpenTelemetry SDK and
// the Prometheus client: instrumented packages depend on the OTel API alone,
// so a program that does not export metrics pays for neither.
package promexport

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Exporter is a MeterProvider whose metrics are served in the Prometheus
// exposition format from a registry of its own (never the global default
// registry). Create one per process, pass [Prometheus.MeterProvider] as
// Providers.Meter to every component and mount [Exporter.MetricsHandler]
// at /metrics.
type Exporter struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// New returns an exporter with a registry of its own. res describes the process
// (service.name, ...: the target_info metric and every series' job label
// carry it); nil uses the SDK's default resource, whose service name is
// "unknown_service:<executable>" (see [ServiceResource]). Metric names
// are translated by the exporter: dots become underscores, units and
// _total are appended (saga.transitions → saga_transitions_total). The
// registry also holds the Go runtime's metrics (go_*: goroutines, memory,
// GC) and the process's (process_*: CPU, resident memory, open file
// descriptors, start time).
func New(res *resource.Resource) (*Exporter, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("prometheus exporter: Go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("prometheus exporter: process collector: %w", err)
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	if res != nil {
		opts = append(opts, sdkmetric.WithResource(res))
	}
	return &Exporter{
		provider: sdkmetric.NewMeterProvider(opts...),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
	}, nil
}

// ServiceResource describes a process of the named service for [New]: the
// SDK's default resource (SDK name and version, and what the
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME variables say) with
// service.name set to service unless OTEL_SERVICE_NAME set one.
func ServiceResource(service string) (*resource.Resource, error) {
	if os.Getenv("OTEL_SERVICE_NAME") != "" {
		return resource.Default(), nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		return nil, fmt.Errorf("resource of service %s: %w", service, err)
	}
	return res, nil
}

// MeterProvider returns the provider to put in Providers.Meter.
func (p *Exporter) MeterProvider() metric.MeterProvider { return p.provider }

// MetricsHandler serves the metrics (GET /metrics). Every scrape runs the
// observable gauges' callbacks, i.e. their database queries.
func (p *Exporter) MetricsHandler() http.Handler { return p.handler }

// Shutdown stops the provider; later scrapes return no runtime metrics.
func (p *Exporter) Shutdown(ctx context.Context) error {
	if err := p.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut down prometheus meter provider: %w", err)
	}
	return nil
}
