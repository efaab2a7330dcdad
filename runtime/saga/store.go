package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/sagadef"
)

// queries holds the SQL for one instance table. Built once in New: the table
// name is validated and quoted there, never interpolated from input.
type queries struct {
	insert        string
	existingByKey string
	lockByID      string
	lockByKey     string
	lockMany      string
	selectByID    string
	selectByKey   string
	update        string
	updateMany    string
	claimDue      string
	deferDue      string
	insertAudit   string
}

// columns is the select list every query that loads an instance uses, in the
// order scanRow expects.
const columns = `id::text, business_key, state, version, data, attempt,
	coalesce(pending_message_id::text, ''), progress, timeout_at, deadline_at,
	coalesce(last_error, ''), coalesce(review_reason, ''), created_at, updated_at`

func newQueries(table string) queries {
	return queries{
		insert: `INSERT INTO ` + table + ` (id, business_key, state, version, data, attempt,
	pending_message_id, progress, timeout_at, deadline_at, last_error, review_reason, created_at, updated_at)
VALUES ($1::uuid, $2, $3, $4, $5, $6, NULLIF($7, '')::uuid, $8::jsonb, $9, $10, NULLIF($11, ''), NULLIF($12, ''), $13, $13)
ON CONFLICT (business_key) DO NOTHING
RETURNING id::text`,
		existingByKey: `SELECT ` + columns + ` FROM ` + table + ` WHERE business_key = $1`,
		lockByID:      `SELECT ` + columns + ` FROM ` + table + ` WHERE id = $1::uuid FOR UPDATE`,
		lockByKey:     `SELECT ` + columns + ` FROM ` + table + ` WHERE business_key = $1 FOR UPDATE`,
		// lockMany locks the batch's instances one id at a time, in id
		// order (so two batches lock what they share in the same order), each
		// through the primary key. "WHERE id = ANY($1) ORDER BY id FOR
		// UPDATE" had a generic plan, cached while the table was new (never
		// analyzed: 10 pages assumed), that sorted a sequential scan of the
		// whole table, and kept it as the table grew.
		lockMany: `SELECT ` + columns + ` FROM (SELECT DISTINCT k FROM unnest($1::uuid[]) AS u(k) ORDER BY k) AS ks
CROSS JOIN LATERAL (SELECT * FROM ` + table + ` t WHERE t.id = ks.k FOR UPDATE) AS x
ORDER BY ks.k`,
		selectByID:  `SELECT ` + columns + ` FROM ` + table + ` WHERE id = $1::uuid`,
		selectByKey: `SELECT ` + columns + ` FROM ` + table + ` WHERE business_key = $1`,
		update: `UPDATE ` + table + ` SET state = $3, version = $4, data = $5, attempt = $6,
	pending_message_id = NULLIF($7, '')::uuid, progress = $8::jsonb, timeout_at = $9, deadline_at = $10,
	last_error = NULLIF($11, ''), review_reason = NULLIF($12, ''), updated_at = $13
WHERE id = $1::uuid AND version = $2`,
		// updateMany is update for many rows at once (see staged.go).
		// "t.id = ANY($1)" is the join condition again, for the planner:
		// a plan cached while the table was small joins by hash over a
		// sequential scan without it, and keeps doing so as the table
		// grows, until it is analyzed.
		updateMany: `UPDATE ` + table + ` t SET state = u.state, version = u.version, data = u.data, attempt = u.attempt,
	pending_message_id = NULLIF(u.pending, '')::uuid, progress = u.progress::jsonb, timeout_at = u.timeout_at,
	deadline_at = u.deadline_at, last_error = NULLIF(u.last_error, ''), review_reason = NULLIF(u.review_reason, ''),
	updated_at = u.updated_at
FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::int8[], $5::bytea[], $6::int4[], $7::text[], $8::text[],
  $9::timestamptz[], $10::timestamptz[], $11::text[], $12::text[], $13::timestamptz[])
  AS u(id, stored, state, version, data, attempt, pending, progress, timeout_at, deadline_at, last_error, review_reason, updated_at)
WHERE t.id = ANY($1::uuid[]) AND t.id = u.id AND t.version = u.stored`,
		// claimDue locks due instances that no other scanner holds, in the
		// states a clock acts on that this engine's definition knows ($3):
		// an instance in a state only another release of the definition
		// has (a rolling upgrade) is left to that release's scanners instead
		// of being deferred as a failure here. least() is the earlier of
		// the two, ignoring a NULL, and is what the generated _due_at
		// index holds, without the instances in manual review (no clock
		// acts on them; their deadline waits for them to leave it): the
		// claim reads only due instances (an OR of the two columns is a
		// sequential scan of the whole table). The manual review state is
		// named for PostgreSQL to see that the index covers the claim;
		// $3 never holds it.
		claimDue: `SELECT ` + columns + ` FROM ` + table + `
WHERE least(timeout_at, deadline_at) <= $1 AND state <> '` + sagadef.StateManualReview + `' AND state = ANY($3::text[])
ORDER BY least(timeout_at, deadline_at)
LIMIT $2
FOR UPDATE SKIP LOCKED`,
		deferDue: `UPDATE ` + table + ` SET last_error = $2,
	progress = jsonb_set(coalesce(progress, '{}'), '{deferrals}', to_jsonb($4::int)),
	timeout_at = CASE WHEN timeout_at IS NOT NULL AND timeout_at < $3 THEN $3 ELSE timeout_at END,
	deadline_at = CASE WHEN deadline_at IS NOT NULL AND deadline_at < $3 THEN $3 ELSE deadline_at END
WHERE id = $1::uuid`,
		insertAudit: `INSERT INTO saga_audit (saga_id, saga_type, from_state, to_state, trigger, class,
	message_id, causation_id, operator, note, version, at)
VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
	}
}

// row is one instance row as stored.
type row struct {
	ID           string
	BusinessKey  string
	State        string
	Version      int64
	Data         []byte
	Attempt      int
	PendingID    string
	Progress     []byte
	TimeoutAt    *time.Time
	DeadlineAt   *time.Time
	LastError    string
	ReviewReason string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

func scanRow(r pgx.Row) (row, error) {
	var w row
	err := r.Scan(&w.ID, &w.BusinessKey, &w.State, &w.Version, &w.Data, &w.Attempt,
		&w.PendingID, &w.Progress, &w.TimeoutAt, &w.DeadlineAt,
		&w.LastError, &w.ReviewReason, &w.CreatedAt, &w.UpdatedAt)
	return w, err
}

// loadRow runs a single-row instance query. It returns ErrNotFound (wrapped)
// when no row matches.
func loadRow(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, sql string, arg string) (row, error) {
	w, err := scanRow(q.QueryRow(ctx, sql, arg))
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, ErrNotFound
	}
	return w, err
}

// instance decodes a row into the machine's view of it. Data it cannot
// decode leaves inst.Data nil and returns inst with an error matching
// ErrUnreadableData (see AppliesWithoutData).
func (e *Engine) instance(w row) (inst sagadef.Instance, err error) {
	data := e.cfg.NewData()
	if derr := proto.Unmarshal(w.Data, data); derr != nil {
		data = nil
		err = fmt.Errorf("saga %s: %w (%d bytes): %v", w.ID, ErrUnreadableData, len(w.Data), derr)
	}
	var p sagadef.Progress
	if len(w.Progress) > 0 {
		if err := json.Unmarshal(w.Progress, &p); err != nil {
			return sagadef.Instance{}, fmt.Errorf("decode progress of saga %s: %w", w.ID, err)
		}
	}
	inst = sagadef.Instance{
		ID:               w.ID,
		Type:             e.def.Name,
		BusinessKey:      w.BusinessKey,
		State:            w.State,
		Version:          w.Version,
		Data:             data,
		Attempt:          w.Attempt,
		PendingMessageID: w.PendingID,
		Progress:         p,
		LastError:        w.LastError,
		ReviewReason:     w.ReviewReason,
	}
	if w.TimeoutAt != nil {
		inst.TimeoutAt = w.TimeoutAt.UTC()
	}
	if w.DeadlineAt != nil {
		inst.DeadlineAt = w.DeadlineAt.UTC()
	}
	return inst, err
}

// AppliesWithoutData reports the triggers that neither read nor change saga
// data, so they apply to an instance whose data cannot be decoded
// (ErrUnreadableData); UnreadableDataHint says so to operators.
func AppliesWithoutData(kind string) bool {
	switch kind {
	case sagadef.TriggerOperatorCancel, sagadef.TriggerOperatorResolve, sagadef.TriggerStuck, sagadef.TriggerDeadline:
		return true
	}
	return false
}

// instanceFor is instance for applying trigger kind: unreadable data is an
// error only when the trigger needs the data.
func (e *Engine) instanceFor(w row, kind string) (sagadef.Instance, error) {
	inst, err := e.instance(w)
	if errors.Is(err, ErrUnreadableData) && AppliesWithoutData(kind) {
		return inst, nil
	}
	return inst, err
}

// encoded is an instance in its stored form.
type encoded struct {
	Data       []byte
	Progress   []byte
	TimeoutAt  *time.Time
	DeadlineAt *time.Time
}

// encode stores inst; stored is the data as stored, kept when inst.Data is
// nil (data that could not be decoded, which a data-free trigger leaves as
// it is).
func encode(inst sagadef.Instance, stored []byte) (encoded, error) {
	data := stored
	if inst.Data != nil {
		var err error
		data, err = proto.MarshalOptions{Deterministic: true}.Marshal(inst.Data)
		if err != nil {
			return encoded{}, fmt.Errorf("encode data of saga %s: %w", inst.ID, err)
		}
	} else if stored == nil {
		return encoded{}, fmt.Errorf("encode saga %s: data is nil", inst.ID)
	}
	progress, err := json.Marshal(inst.Progress)
	if err != nil {
		return encoded{}, fmt.Errorf("encode progress of saga %s: %w", inst.ID, err)
	}
	return encoded{Data: data, Progress: progress, TimeoutAt: timePtr(inst.TimeoutAt), DeadlineAt: timePtr(inst.DeadlineAt)}, nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// changed reports whether the instance after a transition differs from the
// stored row. Unchanged instances are not written (and keep their version):
// a duplicate or an ignored late reply has no effect but its audit row.
func changed(before row, after sagadef.Instance, enc encoded) bool {
	if before.State != after.State || before.Attempt != after.Attempt ||
		before.PendingID != after.PendingMessageID || before.LastError != after.LastError ||
		before.ReviewReason != after.ReviewReason || !bytes.Equal(before.Data, enc.Data) ||
		!sameTime(before.TimeoutAt, enc.TimeoutAt) || !sameTime(before.DeadlineAt, enc.DeadlineAt) {
		return true
	}
	return !sameJSON(before.Progress, enc.Progress)
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	// PostgreSQL stores microseconds.
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// sameJSON compares two JSON documents by value (jsonb reorders keys).
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
