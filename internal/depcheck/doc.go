// Package depcheck holds a test of the runtime's dependency graph: a program
// that imports only the runtime links no generator or build tooling, no test
// peers, and — unless it imports the Prometheus exporter — neither the
// OpenTelemetry SDK nor the Prometheus client.
package depcheck
