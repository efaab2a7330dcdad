package admin

import "github.com/protosaga/saga/runtime/internal/parked"

// ParkedListSQLForTest is the statement listing the parked messages that
// match f (with the correlation ids of f.SagaID's saga), newest first, and
// its arguments.
func ParkedListSQLForTest(f ParkedFilter, correlations []string, limit int) (string, []any) {
	where, args := parked.ListSQL(parkedQuery{ParkedFilter: f, correlations: correlations}.filter(), parked.NewestFirst, 0, limit)
	return parked.SelectSQL + where, args
}
