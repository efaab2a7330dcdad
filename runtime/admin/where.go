package admin

import (
	"strconv"
	"strings"
)

// where builds the WHERE clause of a list from the filters in use, one
// statement per combination, so that PostgreSQL plans each for the indexes
// its filters can use. A filter written to switch itself off, as in
//
//	WHERE ($1::text = '' OR business_key = $1)
//
// cannot use the index on business_key in the generic plan a prepared
// statement settles on: it read a million instances to find one key.
type where struct {
	conds []string
	args  []any
}

// arg adds v as the statement's next argument and returns its placeholder.
func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

// and adds a condition.
func (w *where) and(cond string) { w.conds = append(w.conds, cond) }

// String is the clause, or "" without conditions.
func (w *where) String() string {
	if len(w.conds) == 0 {
		return ""
	}
	return "WHERE " + strings.Join(w.conds, "\n  AND ")
}
