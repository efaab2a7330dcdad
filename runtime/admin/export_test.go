package admin

// ParkedListSQLForTest is the statement listing the parked messages that
// match f (with the correlation ids of f.SagaID's saga), newest first, and
// its arguments.
func ParkedListSQLForTest(f ParkedFilter, correlations []string, limit int) (string, []any) {
	where, args := parkedListSQL(parkedQuery{ParkedFilter: f, correlations: correlations}, newestFirst, 0, limit)
	return `SELECT ` + parkedColumns + ` FROM saga_parked ` + where, args
}
