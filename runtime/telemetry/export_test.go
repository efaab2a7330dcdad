package telemetry

// SagaGaugeSQLForTest is the saga gauges' query on table (quoted): $1 the
// states counted, $2, $3, $4 the stuck rule's Args.
func SagaGaugeSQLForTest(table string) string { return sagaGaugeSQL(table) }
