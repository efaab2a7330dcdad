package saga

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/where"
)

// List bounds: the page size when ListFilter.Limit is 0, and the largest
// page.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ErrInvalidFilter is matched (errors.Is) by List's error for a filter it
// refuses: a state the definition does not have, a cursor List did not
// issue, a limit out of range, or an empty time window.
var ErrInvalidFilter = errors.New("invalid saga list filter")

// ListFilter selects the instances [Engine.List] returns. Every field set
// narrows the list; the zero value lists every instance.
type ListFilter struct {
	// States selects instances in any of these states (names of the
	// definition's states).
	States []string
	// BusinessKey selects the instance with this business key.
	BusinessKey string
	// KeyPrefix selects the instances whose business key starts with it
	// (compared byte for byte, whatever the database's collation).
	KeyPrefix string
	// UpdatedAfter and UpdatedBefore select instances last changed
	// strictly after, and strictly before, these times (zero: no bound).
	UpdatedAfter, UpdatedBefore time.Time
	// CreatedAfter and CreatedBefore select instances created strictly
	// after, and strictly before, these times (zero: no bound).
	CreatedAfter, CreatedBefore time.Time
	// Oldest lists the oldest instances first (by creation time, then id)
	// instead of the newest.
	Oldest bool
	// Stuck selects the instances stuck by this rule (the rule of the
	// saga.instances.stuck gauge and the admin API) at StuckAt (zero: the
	// engine's clock).
	Stuck   *StuckRule
	StuckAt time.Time
	// Limit is the page size: 1 to MaxListLimit, 0 for DefaultListLimit.
	Limit int
	// After continues a list after the instance this cursor names (a
	// ListPage.NextCursor, or CursorOf of a listed instance); "" starts
	// from the newest.
	After string
}

// ListPage is one page of instances, newest first (by creation time, then
// id; oldest first with ListFilter.Oldest). NextCursor continues the list;
// it is empty on the last page.
type ListPage struct {
	Items      []Status
	NextCursor string
}

// List returns one page of the instances f selects, newest first, with
// their decoded data (an instance whose data cannot be decoded is listed
// with Status.DataError). Pages are keyset-paginated on (created_at, id),
// which the generated (created_at, id) index serves; instances created
// while a client pages do not shift the pages after its cursor. The states
// are written into the statement, so that PostgreSQL plans a rare state
// through the state index, and a business key is looked up by its unique
// index; the time bounds filter the rows read in that order.
//
// Errors: a filter List refuses matches [ErrInvalidFilter].
func (e *Engine) List(ctx context.Context, f ListFilter) (ListPage, error) {
	sql, args, limit, err := e.listSQL(f)
	if err != nil {
		return ListPage{}, fmt.Errorf("list %s sagas: %w", e.def.Name, err)
	}
	rows, err := e.cfg.Pool.Query(ctx, sql, args...)
	if err != nil {
		return ListPage{}, fmt.Errorf("list %s sagas: %w", e.def.Name, err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) { return scanRow(r) })
	if err != nil {
		return ListPage{}, fmt.Errorf("list %s sagas: %w", e.def.Name, err)
	}
	var page ListPage
	if len(ws) > limit {
		ws = ws[:limit]
		last := ws[len(ws)-1]
		page.NextCursor = cursor{at: last.CreatedAt, id: last.ID}.String()
	}
	page.Items = make([]Status, 0, len(ws))
	for _, w := range ws {
		st, err := e.status(w)
		if err != nil {
			return ListPage{}, fmt.Errorf("list %s sagas: %w", e.def.Name, err)
		}
		page.Items = append(page.Items, st)
	}
	return page, nil
}

// CursorOf returns the cursor that continues a list after st: a page of
// instances merged from several lists (of several saga types, in the same
// newest-first order) ends with it.
func CursorOf(st Status) string { return cursor{at: st.CreatedAt, id: st.ID}.String() }

// listSQL builds the statement of one page of f: one statement per
// combination of the filters in use, so that PostgreSQL plans each for the
// indexes its filters can use. A filter written to switch itself off, as
// in
//
//	WHERE ($1::text = '' OR business_key = $1)
//
// cannot use the business key's index in the generic plan a prepared
// statement settles on. It returns the page size; the statement reads one
// row more, to tell whether a page follows.
func (e *Engine) listSQL(f ListFilter) (sql string, args []any, limit int, err error) {
	limit = f.Limit
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 0 || limit > MaxListLimit:
		return "", nil, 0, fmt.Errorf("limit %d: want 1 to %d: %w", f.Limit, MaxListLimit, ErrInvalidFilter)
	}
	var w where.Clause
	if len(f.States) > 0 {
		states := slices.Clone(f.States)
		slices.Sort(states)
		states = slices.Compact(states)
		for _, s := range states {
			if _, ok := e.stateKind[s]; !ok {
				return "", nil, 0, fmt.Errorf("state %q is not a state of %s: %w", s, e.def.Name, ErrInvalidFilter)
			}
		}
		// Written into the statement (StatesSQL): checked above,
		// they are names of the definition's states.
		w.And(StatesSQL(states...))
	}
	if f.BusinessKey != "" {
		w.And("t.business_key = " + w.Arg(f.BusinessKey))
	}
	if f.KeyPrefix != "" {
		w.And("starts_with(t.business_key, " + w.Arg(f.KeyPrefix) + ")")
	}
	for _, win := range []struct {
		column        string
		after, before time.Time
	}{{"updated_at", f.UpdatedAfter, f.UpdatedBefore}, {"created_at", f.CreatedAfter, f.CreatedBefore}} {
		if !win.after.IsZero() && !win.before.IsZero() && !win.after.Before(win.before) {
			return "", nil, 0, fmt.Errorf("%s after %s and before %s: an empty window: %w", strings.TrimSuffix(win.column, "_at"),
				win.after.Format(time.RFC3339Nano), win.before.Format(time.RFC3339Nano), ErrInvalidFilter)
		}
		if !win.after.IsZero() {
			w.And("t." + win.column + " > " + w.Arg(win.after) + "::timestamptz")
		}
		if !win.before.IsZero() {
			w.And("t." + win.column + " < " + w.Arg(win.before) + "::timestamptz")
		}
	}
	if f.Stuck != nil {
		at := f.StuckAt
		if at.IsZero() {
			at = e.cfg.Now()
		}
		states, limits, grace := f.Stuck.Args()
		w.And(StuckSQL(w.Arg(at), w.Arg(states), w.Arg(limits), w.Arg(grace)))
	}
	if f.After != "" {
		c, err := parseCursor(f.After)
		if err != nil {
			return "", nil, 0, err
		}
		cmp := "<"
		if f.Oldest {
			cmp = ">"
		}
		w.And("(t.created_at, t.id) " + cmp + " (" + w.Arg(c.at) + "::timestamptz, " + w.Arg(c.id) + "::uuid)")
	}
	order := "DESC"
	if f.Oldest {
		order = "ASC"
	}
	return `SELECT ` + columns + ` FROM ` + e.table + ` AS t
` + w.String() + `
ORDER BY t.created_at ` + order + `, t.id ` + order + `
LIMIT ` + w.Arg(limit+1), w.Args, limit, nil
}

// cursor is a keyset position in the creation order (newest or oldest
// first, as the filter says).
type cursor struct {
	at time.Time
	id string
}

// String is the cursor as an opaque token: creation time in microseconds
// (what PostgreSQL stores) and id, base64url.
func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.at.UnixMicro(), 10) + "." + c.id))
}

func parseCursor(s string) (cursor, error) {
	bad := fmt.Errorf("cursor %q is not a cursor a saga list issued: %w", s, ErrInvalidFilter)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, bad
	}
	us, id, ok := strings.Cut(string(raw), ".")
	if !ok {
		return cursor{}, bad
	}
	n, err := strconv.ParseInt(us, 10, 64)
	if err != nil {
		return cursor{}, bad
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return cursor{}, bad
	}
	return cursor{at: time.UnixMicro(n).UTC(), id: u.String()}, nil
}

// CheckCursor reports whether s is a cursor List accepts (an error
// matching ErrInvalidFilter otherwise), for callers that validate a
// request before listing.
func CheckCursor(s string) error {
	if s == "" {
		return nil
	}
	_, err := parseCursor(s)
	return err
}
