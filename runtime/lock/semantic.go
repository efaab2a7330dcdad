package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrPending is matched by the error of [MarkPendingTx] and
// [CheckPendingTx] when another saga holds the record pending.
var ErrPending = errors.New("record is pending in another saga")

// Pending is a semantic lock: a business record a saga changed and has not
// settled yet.
type Pending struct {
	// Resource names the record ("order/42", "account/7").
	Resource string
	// SagaID is the saga that marked it; Reason why.
	SagaID, Reason string
	// MarkedAt is when it was marked (database clock).
	MarkedAt time.Time
}

// PendingError is the error of a record another saga holds pending. It
// matches [ErrPending]. A participant that meets it waits (return it
// wrapped in failure.Transient: the command is retried later), or answers a
// business failure when waiting makes no sense.
type PendingError struct {
	Pending
}

func (e *PendingError) Error() string {
	return fmt.Sprintf("%s is pending in saga %s since %s (%s)", e.Resource, e.SagaID, e.MarkedAt.UTC().Format(time.RFC3339), e.Reason)
}

// Is reports whether target is ErrPending.
func (e *PendingError) Is(target error) bool { return target == ErrPending }

const markSQL = `INSERT INTO saga_pending AS p (resource, saga_id, reason) VALUES ($1, $2, $3)
ON CONFLICT (resource) DO UPDATE SET reason = excluded.reason WHERE p.saga_id = excluded.saga_id
RETURNING saga_id`

// MarkPendingTx marks resource pending for sagaID in tx, the participant's
// transaction that changes the record. Marking it again for the same saga
// (a redelivered command) updates the reason. When another saga holds it,
// it returns a *[PendingError] and marks nothing. A concurrent marker
// waits for the other transaction to end.
func MarkPendingTx(ctx context.Context, tx pgx.Tx, resource, sagaID, reason string) error {
	if resource == "" || sagaID == "" {
		return fmt.Errorf("mark pending: empty resource (%q) or saga id (%q)", resource, sagaID)
	}
	for {
		var got string
		err := tx.QueryRow(ctx, markSQL, resource, sagaID, reason).Scan(&got)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("mark %q pending for saga %s: %w", resource, sagaID, err)
		}
		p, ok, err := PendingTx(ctx, tx, resource)
		if err != nil {
			return err
		}
		if ok {
			return &PendingError{p}
		}
		// Cleared between the two statements (READ COMMITTED): mark again.
	}
}

// ClearPendingTx removes sagaID's mark on resource in tx (when the saga
// settled the record, or its compensation undid the change) and reports
// whether there was one. Another saga's mark is left alone.
func ClearPendingTx(ctx context.Context, tx pgx.Tx, resource, sagaID string) (bool, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM saga_pending WHERE resource = $1 AND saga_id = $2`, resource, sagaID)
	if err != nil {
		return false, fmt.Errorf("clear pending %q of saga %s: %w", resource, sagaID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// PendingTx returns the mark on resource, if any.
func PendingTx(ctx context.Context, tx pgx.Tx, resource string) (Pending, bool, error) {
	p := Pending{Resource: resource}
	err := tx.QueryRow(ctx, `SELECT saga_id, reason, marked_at FROM saga_pending WHERE resource = $1`, resource).
		Scan(&p.SagaID, &p.Reason, &p.MarkedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Pending{}, false, nil
	}
	if err != nil {
		return Pending{}, false, fmt.Errorf("read pending mark of %q: %w", resource, err)
	}
	return p, true, nil
}

// CheckPendingTx returns a *[PendingError] when a saga other than sagaID
// holds resource pending (sagaID may be empty: any mark counts), and nil
// otherwise. It takes no lock: use MarkPendingTx to claim the record.
func CheckPendingTx(ctx context.Context, tx pgx.Tx, resource, sagaID string) error {
	p, ok, err := PendingTx(ctx, tx, resource)
	if err != nil {
		return err
	}
	if ok && p.SagaID != sagaID {
		return &PendingError{p}
	}
	return nil
}
