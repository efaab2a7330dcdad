package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// ErrStaleToken is matched by the error of a fencing check that refused a
// write: the writer's lease has been superseded by one with a higher token.
var ErrStaleToken = errors.New("stale fencing token")

// StaleTokenError is the error of a refused write. It matches
// [ErrStaleToken].
type StaleTokenError struct {
	// Resource is what the write was for.
	Resource string
	// Token is the refused writer's token; Highest the highest the resource
	// has accepted.
	Token, Highest int64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("write to %q with fencing token %d refused: the resource accepted token %d", e.Resource, e.Token, e.Highest)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Fence is the fencing check of resources served by one Go process (an HTTP
// service that takes the token in a request header, a device driver): it
// remembers the highest token each resource accepted. The zero value is
// ready to use; it is safe for concurrent use.
type Fence struct {
	mu      sync.Mutex
	highest map[string]int64
}

// Admit accepts token for resource when it is at least the highest token
// resource has accepted, and records it; it returns a *[StaleTokenError]
// otherwise. Run the write while holding the admission's guarantee: call
// Admit and write under one lock of the resource (see [Fence.Write]).
func (f *Fence) Admit(resource string, token int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.admit(resource, token)
}

func (f *Fence) admit(resource string, token int64) error {
	if f.highest == nil {
		f.highest = map[string]int64{}
	}
	if h, ok := f.highest[resource]; ok && token < h {
		return &StaleTokenError{Resource: resource, Token: token, Highest: h}
	}
	f.highest[resource] = token
	return nil
}

// Write runs write when token is admitted for resource, with the fence held,
// so no write with a higher token interleaves with it. An error from write
// is returned as is (the token stays admitted).
func (f *Fence) Write(resource string, token int64, write func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.admit(resource, token); err != nil {
		return err
	}
	return write()
}

// Highest returns the highest token resource has accepted (0 when none).
func (f *Fence) Highest(resource string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest[resource]
}

// fenceSQL records token as the resource's highest, unless a higher one is
// recorded. The row stays locked until tx ends, so the guarded write in the
// same transaction cannot interleave with a writer holding a newer lease.
const fenceSQL = `INSERT INTO saga_fences AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, updated_at = now()
WHERE f.token <= excluded.token
RETURNING token`

// FenceTx is the fencing check of a resource stored in PostgreSQL (in the
// saga_fences table of the database that holds the resource): it admits
// token for resource in tx, or returns a *[StaleTokenError]. Write the
// effect in the same transaction; the check holds the resource's fence row
// until tx ends.
//
// A table of the team's own can carry the same check in its write instead:
// a token column and `WHERE token <= $new` on the update.
func FenceTx(ctx context.Context, tx pgx.Tx, resource string, token int64) error {
	var got int64
	err := tx.QueryRow(ctx, fenceSQL, resource, token).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		var highest int64
		if err := tx.QueryRow(ctx, `SELECT token FROM saga_fences WHERE resource = $1`, resource).Scan(&highest); err != nil {
			return fmt.Errorf("fence %q: read highest token: %w", resource, err)
		}
		return &StaleTokenError{Resource: resource, Token: token, Highest: highest}
	}
	if err != nil {
		return fmt.Errorf("fence %q with token %d: %w", resource, token, err)
	}
	return nil
}
