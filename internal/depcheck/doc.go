// Package depcheck holds a test of the runtime's dependency graph: a program
// that imports only the runtime links no generator or build tooling, no test
// peers or migration tools (goose and golang-migrate are test dependencies:
// runtime/schema writes their files without linking them), and — unless it imports the Prometheus exporter — neither the
// OpenTelemetry SDK nor the Prometheus client.
package depcheck
