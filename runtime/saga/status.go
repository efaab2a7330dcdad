package saga

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Status is a snapshot of one saga instance.
type Status struct {
	ID          string
	Type        string
	BusinessKey string
	State       string
	// StateKind says whether the state waits on a step, a compensation, an
	// operator, or is terminal.
	StateKind sagadef.StateKind
	// Version increases by one with every change; operator actions name
	// the version they decided on.
	Version int64
	// Attempt counts sends of the current step's command or compensation.
	Attempt          int
	PendingMessageID string
	// Data is the decoded saga data. It may hold sensitive fields: redact
	// before display (message.Info.SensitiveFields). Nil when the stored
	// data cannot be decoded.
	Data proto.Message
	// DataError says why the stored data cannot be decoded (see
	// ErrUnreadableData); empty when Data is set.
	DataError  string
	Progress   sagadef.Progress
	TimeoutAt  time.Time // zero: no timeout armed
	DeadlineAt time.Time // zero: no deadline
	LastError  string
	// ReviewReason says why the instance is in manual review.
	ReviewReason string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// Terminal reports whether the instance has ended.
func (s Status) Terminal() bool { return s.StateKind == sagadef.StateKindTerminal }

func (e *Engine) status(w row) (Status, error) {
	inst, err := e.instance(w)
	dataErr := ""
	if errors.Is(err, ErrUnreadableData) {
		dataErr, err = err.Error(), nil
	}
	if err != nil {
		return Status{}, err
	}
	return Status{
		DataError:        dataErr,
		ID:               w.ID,
		Type:             e.def.Name,
		BusinessKey:      w.BusinessKey,
		State:            w.State,
		StateKind:        e.stateKind[w.State],
		Version:          w.Version,
		Attempt:          w.Attempt,
		PendingMessageID: w.PendingID,
		Data:             inst.Data,
		Progress:         inst.Progress,
		TimeoutAt:        inst.TimeoutAt,
		DeadlineAt:       inst.DeadlineAt,
		LastError:        w.LastError,
		ReviewReason:     w.ReviewReason,
		CreatedAt:        w.CreatedAt.UTC(),
		UpdatedAt:        w.UpdatedAt.UTC(),
	}, nil
}

// Status returns the instance with id sagaID. It returns an error wrapping
// ErrNotFound when there is none.
func (e *Engine) Status(ctx context.Context, sagaID string) (Status, error) {
	if _, err := uuid.Parse(sagaID); err != nil {
		return Status{}, fmt.Errorf("saga %s %q: %w (not a UUID)", e.def.Name, sagaID, ErrNotFound)
	}
	w, err := loadRow(ctx, e.cfg.Pool, e.q.selectByID, sagaID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Status{}, fmt.Errorf("saga %s %s: %w", e.def.Name, sagaID, err)
		}
		return Status{}, fmt.Errorf("load saga %s %s: %w", e.def.Name, sagaID, err)
	}
	return e.status(w)
}

// StatusByBusinessKey returns the instance with the given business key. It
// returns an error wrapping ErrNotFound when there is none.
func (e *Engine) StatusByBusinessKey(ctx context.Context, key string) (Status, error) {
	w, err := loadRow(ctx, e.cfg.Pool, e.q.selectByKey, key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Status{}, fmt.Errorf("saga %s with business key %q: %w", e.def.Name, key, err)
		}
		return Status{}, fmt.Errorf("load saga %s by business key %q: %w", e.def.Name, key, err)
	}
	return e.status(w)
}

// AuditRecord is one row of a saga's audit trail.
type AuditRecord struct {
	ID        int64
	SagaID    string
	SagaType  string
	From      string
	To        string
	Trigger   string // message full name or a sagadef.Trigger* constant
	Class     string // sagadef.Class.String(): new, duplicate, late, conflicting, invalid or early
	MessageID string
	// CausationID is the trigger message's causation id (for a reply: the
	// command it answers).
	CausationID string
	Operator    string
	Note        string
	// Version is the instance version after the transition.
	Version int64
	At      time.Time
}

// History returns the audit trail of one instance, oldest first.
func (e *Engine) History(ctx context.Context, sagaID string) ([]AuditRecord, error) {
	recs, _, err := e.history(ctx, sagaID, 0)
	return recs, err
}

// RecentHistory returns the newest limit rows (limit > 0) of one instance's
// audit trail, oldest first, and whether older rows were left out. It reads
// only those rows, however long the trail.
func (e *Engine) RecentHistory(ctx context.Context, sagaID string, limit int) ([]AuditRecord, bool, error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("saga history %s: limit %d: want a positive limit", sagaID, limit)
	}
	return e.history(ctx, sagaID, limit)
}

// history reads the newest limit rows (0: all) of an instance's audit
// trail, newest first through the (saga_id, id) index, and returns them
// oldest first with whether older rows were left out.
func (e *Engine) history(ctx context.Context, sagaID string, limit int) ([]AuditRecord, bool, error) {
	if _, err := uuid.Parse(sagaID); err != nil {
		return nil, false, fmt.Errorf("saga history %q: %w (not a UUID)", sagaID, ErrNotFound)
	}
	var lim any // NULL: no limit
	if limit > 0 {
		lim = limit + 1
	}
	rows, err := e.cfg.Pool.Query(ctx, `SELECT id, saga_id::text, saga_type, from_state, to_state, trigger, class,
	message_id, causation_id, operator, note, version, at
FROM saga_audit WHERE saga_id = $1::uuid ORDER BY id DESC LIMIT $2::bigint`, sagaID, lim)
	if err != nil {
		return nil, false, fmt.Errorf("saga history %s: %w", sagaID, err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var a AuditRecord
		if err := rows.Scan(&a.ID, &a.SagaID, &a.SagaType, &a.From, &a.To, &a.Trigger, &a.Class,
			&a.MessageID, &a.CausationID, &a.Operator, &a.Note, &a.Version, &a.At); err != nil {
			return nil, false, fmt.Errorf("saga history %s: %w", sagaID, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("saga history %s: %w", sagaID, err)
	}
	more := limit > 0 && len(out) > limit
	if more {
		out = out[:limit]
	}
	slices.Reverse(out)
	return out, more, nil
}
