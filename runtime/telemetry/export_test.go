package telemetry

// SagaGaugeSQLForTest is the saga gauges' query on table (quoted) counting
// states: $1, $2, $3 the stuck rule's Args.
func SagaGaugeSQLForTest(table string, states []string) string { return sagaGaugeSQL(table, states) }
