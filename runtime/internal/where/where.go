// Package where builds the WHERE clause of a list query from the filters in
// use, one statement per combination, so that PostgreSQL plans each for the
// indexes its filters can use. A filter written to switch itself off, as in
//
//	WHERE ($1::text = '' OR business_key = $1)
//
// cannot use the index on business_key in the generic plan a prepared
// statement settles on: it read a million instances to find one key.
package where

import (
	"strconv"
	"strings"
)

// Clause collects a statement's conditions and arguments.
type Clause struct {
	conds []string
	// Args are the statement's arguments, in placeholder order.
	Args []any
}

// Arg adds v as the statement's next argument and returns its placeholder.
func (w *Clause) Arg(v any) string {
	w.Args = append(w.Args, v)
	return "$" + strconv.Itoa(len(w.Args))
}

// And adds a condition.
func (w *Clause) And(cond string) { w.conds = append(w.conds, cond) }

// String is the clause, or "" without conditions.
func (w *Clause) String() string {
	if len(w.conds) == 0 {
		return ""
	}
	return "WHERE " + strings.Join(w.conds, "\n  AND ")
}
