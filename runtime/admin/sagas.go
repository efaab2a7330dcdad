package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// sagaRow is the part of an instance row lists show.
type sagaRow struct {
	ID, BusinessKey, State  string
	Version                 int64
	Attempt                 int
	PendingID               string
	TimeoutAt, DeadlineAt   *time.Time
	LastError, ReviewReason string
	ReviewFrom              string
	ChildReview             *sagadef.ChildReview
	CreatedAt, UpdatedAt    time.Time
}

// hasState reports whether name is a state of t.
func (t *sagaType) hasState(name string) bool {
	_, ok := t.def.LookupState(name)
	return ok
}

// view turns a row into its API form, with the stuck verdict at now.
func (t *sagaType) view(w sagaRow, now time.Time) Saga {
	st, _ := t.def.LookupState(w.State)
	out := Saga{
		ID: w.ID, Type: t.def.Name, BusinessKey: w.BusinessKey, State: w.State, StateKind: st.Kind.String(),
		Step: st.Step, Version: w.Version, Attempt: w.Attempt, PendingMessageID: w.PendingID,
		TimeoutAt: utcPtr(w.TimeoutAt), DeadlineAt: utcPtr(w.DeadlineAt), LastError: w.LastError,
		ReviewReason: w.ReviewReason, ReviewFrom: w.ReviewFrom,
		CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC(),
	}
	out.StuckReason = t.stuckReason(w, now)
	out.Stuck = out.StuckReason != ""
	if w.State == sagadef.StateCompleted || w.State == sagadef.StateCancelled {
		// An error the saga got past (a timeout it retried, a failure an
		// operator repaired) says nothing about a saga that ended well or
		// was ended on purpose; its timeline keeps it.
		out.LastError = ""
	}
	return out
}

// stuckReason says why an instance is stuck at now, or "" when it is not:
// saga.StuckRule, the rule of the stuck filter of listSQL and of the
// saga.instances.stuck gauge.
func (t *sagaType) stuckReason(w sagaRow, now time.Time) string {
	return t.stuck.Reason(w.State, w.ChildReview, w.TimeoutAt, w.DeadlineAt, w.UpdatedAt, now)
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// rowOf converts an engine status to a list row.
func rowOf(st saga.Status) sagaRow {
	w := sagaRow{
		ID: st.ID, BusinessKey: st.BusinessKey, State: st.State, Version: st.Version, Attempt: st.Attempt,
		PendingID: st.PendingMessageID, LastError: st.LastError, ReviewReason: st.ReviewReason,
		ReviewFrom: st.Progress.ReviewFrom, ChildReview: st.Progress.ChildReview, CreatedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt,
	}
	if !st.TimeoutAt.IsZero() {
		w.TimeoutAt = &st.TimeoutAt
	}
	if !st.DeadlineAt.IsZero() {
		w.DeadlineAt = &st.DeadlineAt
	}
	return w
}

var stateName = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,127}$`)

// scope validates f and returns the saga types it selects.
func (s *Server) scope(f SagaFilter) ([]*sagaType, error) {
	types := s.sagas
	if f.Type != "" {
		t, ok := s.byName[f.Type]
		if !ok {
			return nil, badRequest("unknown saga type %q (served: %s)", f.Type, strings.Join(s.typeNames(), ", "))
		}
		types = []*sagaType{t}
	}
	if f.State != "" {
		if !stateName.MatchString(f.State) {
			return nil, badRequest("state %q: want an upper-case state name such as RESERVE_INVENTORY", f.State)
		}
		found := false
		for _, t := range types {
			found = found || t.hasState(f.State)
		}
		if !found {
			return nil, badRequest("state %q is not a state of %s", f.State, strings.Join(namesOf(types), " or "))
		}
	}
	if err := checkText("business_key", f.BusinessKey, 1000); err != nil {
		return nil, err
	}
	if err := checkText("key_prefix", f.KeyPrefix, 1000); err != nil {
		return nil, err
	}
	for _, win := range []struct {
		name          string
		after, before *time.Time
	}{{"created", f.CreatedAfter, f.CreatedBefore}, {"updated", f.UpdatedAfter, f.UpdatedBefore}} {
		if win.after != nil && win.before != nil && !win.after.Before(*win.before) {
			return nil, badRequest("%s_after %s is not before %s_before %s: an empty window", win.name,
				win.after.Format(time.RFC3339), win.name, win.before.Format(time.RFC3339))
		}
	}
	if f.Review && f.State != "" && f.State != sagadef.StateManualReview {
		return nil, badRequest("review selects state %s; state=%s contradicts it", sagadef.StateManualReview, f.State)
	}
	if f.Review && f.Stuck {
		return nil, badRequest("stuck and review exclude each other: sagas in manual review wait for an operator, not a timeout")
	}
	return types, nil
}

func (s *Server) typeNames() []string { return namesOf(s.sagas) }

func namesOf(ts []*sagaType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.def.Name
	}
	return out
}

// listedSaga is an instance with its type, for merging pages across types.
type listedSaga struct {
	t  *sagaType
	st saga.Status
	w  sagaRow
}

// list returns up to limit instances matching f, newest first, after the
// cursor (empty: from the start), and whether more follow. Each type's page
// comes from its engine (saga.Engine.List, the one listing query of an
// instance table); the pages are merged in the same newest-first order,
// which one cursor continues for every type.
func (s *Server) list(ctx context.Context, types []*sagaType, f SagaFilter, oldest bool, limit int, after string) ([]listedSaga, bool, error) {
	now := s.cfg.Now()
	var all []listedSaga
	more := false
	deref := func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	}
	for _, t := range types {
		if f.State != "" && !t.hasState(f.State) {
			continue
		}
		lf := saga.ListFilter{BusinessKey: f.BusinessKey, KeyPrefix: f.KeyPrefix, Limit: limit, After: after, Oldest: oldest,
			CreatedAfter: deref(f.CreatedAfter), CreatedBefore: deref(f.CreatedBefore),
			UpdatedAfter: deref(f.UpdatedAfter), UpdatedBefore: deref(f.UpdatedBefore)}
		switch {
		case f.State != "":
			lf.States = []string{f.State}
		case f.Review:
			lf.States = []string{sagadef.StateManualReview}
		}
		if f.Stuck {
			lf.Stuck, lf.StuckAt = &t.stuck, now
		}
		page, err := t.engine.List(ctx, lf)
		if err != nil {
			return nil, false, err
		}
		more = more || page.NextCursor != ""
		for _, st := range page.Items {
			all = append(all, listedSaga{t: t, st: st, w: rowOf(st)})
		}
	}
	slices.SortFunc(all, func(a, b listedSaga) int {
		if oldest {
			a, b = b, a
		}
		if c := b.w.CreatedAt.Compare(a.w.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.w.ID, a.w.ID)
	})
	if len(all) > limit {
		all, more = all[:limit], true
	}
	return all, more, nil
}

func (s *Server) handleListSagas(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "type", "state", "business_key", "key_prefix", "stuck", "review", "created_after", "created_before",
		"updated_after", "updated_before", "sort", "limit", "cursor")
	if err != nil {
		return err
	}
	f := SagaFilter{Type: q.str("type"), State: q.str("state"), BusinessKey: q.str("business_key"), KeyPrefix: q.str("key_prefix")}
	for _, tv := range []struct {
		name string
		dst  **time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}, {"updated_after", &f.UpdatedAfter}, {"updated_before", &f.UpdatedBefore}} {
		if *tv.dst, err = q.time(tv.name); err != nil {
			return err
		}
	}
	var oldest bool
	switch q.str("sort") {
	case "", SortNewest:
	case SortOldest:
		oldest = true
	default:
		return badRequest("sort=%q: want %s or %s", q.str("sort"), SortNewest, SortOldest)
	}
	if f.Stuck, err = q.boolean("stuck"); err != nil {
		return err
	}
	if f.Review, err = q.boolean("review"); err != nil {
		return err
	}
	limit, err := q.limit()
	if err != nil {
		return err
	}
	after := q.str("cursor")
	if saga.CheckCursor(after) != nil {
		return badRequest("cursor %q is not a cursor this server issued", after)
	}
	types, err := s.scope(f)
	if err != nil {
		return err
	}
	items, more, err := s.list(r.Context(), types, f, oldest, limit, after)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	page := SagaPage{Items: make([]Saga, 0, len(items))}
	for _, it := range items {
		page.Items = append(page.Items, it.t.view(it.w, now))
	}
	if more {
		page.NextCursor = saga.CursorOf(items[len(items)-1].st)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// parseSagaID validates a saga id from a path or body.
func parseSagaID(raw string) (string, error) {
	u, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return "", badRequest("saga id %q is not a UUID", raw)
	}
	return u.String(), nil
}

// find returns the saga with the given id, in the named type or any.
func (s *Server) find(ctx context.Context, id, typeName string) (*sagaType, saga.Status, error) {
	types := s.sagas
	if typeName != "" {
		t, ok := s.byName[typeName]
		if !ok {
			return nil, saga.Status{}, badRequest("unknown saga type %q (served: %s)", typeName, strings.Join(s.typeNames(), ", "))
		}
		types = []*sagaType{t}
	}
	for _, t := range types {
		st, err := t.engine.Status(ctx, id)
		if errors.Is(err, saga.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, saga.Status{}, fmt.Errorf("load saga %s: %w", id, err)
		}
		return t, st, nil
	}
	return nil, saga.Status{}, apiErr(http.StatusNotFound, "not_found", "no saga %s among %s", id, strings.Join(namesOf(types), ", "))
}
