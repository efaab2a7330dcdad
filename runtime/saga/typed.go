package saga

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Snapshot is one saga instance as application code reads it through the
// generated typed wrapper: S is the saga's generated state type (a string
// type with a constant per state), D its data message. Generated code
// names the instantiation: PlaceOrderSnapshot is
// Snapshot[PlaceOrderState, *PlaceOrderData].
type Snapshot[S ~string, D proto.Message] struct {
	ID          string
	BusinessKey string
	State       S
	// StateKind says whether State waits on a step, a compensation, an
	// operator, or is terminal.
	StateKind sagadef.StateKind
	// Data is the saga data; nil when the stored data cannot be decoded,
	// and DataError says why.
	Data      D
	DataError string
	// Version increases by one with every change.
	Version int64
	// Attempt counts sends of the current step's command or compensation.
	Attempt int
	// LastError is the last business failure or timeout; ReviewReason why
	// the instance is in manual review. Both may name messages and steps;
	// neither is meant for a client as it is.
	LastError    string
	ReviewReason string
	// Cancel is the business cancel the instance applied (who asked, why),
	// nil when none did.
	Cancel     *sagadef.Cancellation
	TimeoutAt  time.Time // zero: no timeout armed
	DeadlineAt time.Time // zero: no deadline
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Terminal reports whether the instance has ended (COMPLETED, FAILED or
// CANCELLED).
func (s *Snapshot[S, D]) Terminal() bool { return s.StateKind == sagadef.StateKindTerminal }

// SnapshotOf returns st typed.
func SnapshotOf[S ~string, D proto.Message](st Status) *Snapshot[S, D] {
	data, _ := st.Data.(D)
	return &Snapshot[S, D]{
		ID: st.ID, BusinessKey: st.BusinessKey, State: S(st.State), StateKind: st.StateKind,
		Data: data, DataError: st.DataError, Version: st.Version, Attempt: st.Attempt,
		LastError: st.LastError, ReviewReason: st.ReviewReason, Cancel: st.Progress.Cancel,
		TimeoutAt: st.TimeoutAt, DeadlineAt: st.DeadlineAt, CreatedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt,
	}
}

// Filter selects the instances a generated List returns; the zero value
// lists every instance, newest first, DefaultListLimit at a time.
type Filter[S ~string] struct {
	// States selects instances in any of these states.
	States []S
	// UpdatedAfter and UpdatedBefore select instances last changed
	// strictly after, and strictly before, these times (zero: no bound).
	UpdatedAfter, UpdatedBefore time.Time
	// Limit is the page size: 1 to MaxListLimit, 0 for DefaultListLimit.
	Limit int
	// Cursor continues a list: the NextCursor of the page before.
	Cursor string
}

// Page is one page of a generated List, newest first; NextCursor is empty
// on the last page.
type Page[S ~string, D proto.Message] struct {
	Items      []*Snapshot[S, D]
	NextCursor string
}

// Get returns the instance with the given business key, typed; an error
// wrapping ErrNotFound when there is none. Generated code calls it.
func Get[S ~string, D proto.Message](ctx context.Context, e *Engine, businessKey string) (*Snapshot[S, D], error) {
	st, err := e.StatusByBusinessKey(ctx, businessKey)
	if err != nil {
		return nil, err
	}
	return SnapshotOf[S, D](st), nil
}

// GetByID returns the instance with the given saga id, typed; an error
// wrapping ErrNotFound when there is none. Generated code calls it.
func GetByID[S ~string, D proto.Message](ctx context.Context, e *Engine, sagaID string) (*Snapshot[S, D], error) {
	st, err := e.Status(ctx, sagaID)
	if err != nil {
		return nil, err
	}
	return SnapshotOf[S, D](st), nil
}

// List returns the page of instances f selects ([Engine.List]), typed.
// Generated code calls it.
func List[S ~string, D proto.Message](ctx context.Context, e *Engine, f Filter[S]) (Page[S, D], error) {
	lf := ListFilter{UpdatedAfter: f.UpdatedAfter, UpdatedBefore: f.UpdatedBefore, Limit: f.Limit, After: f.Cursor}
	for _, s := range f.States {
		lf.States = append(lf.States, string(s))
	}
	p, err := e.List(ctx, lf)
	if err != nil {
		return Page[S, D]{}, err
	}
	out := Page[S, D]{NextCursor: p.NextCursor, Items: make([]*Snapshot[S, D], len(p.Items))}
	for i, st := range p.Items {
		out.Items[i] = SnapshotOf[S, D](st)
	}
	return out, nil
}
