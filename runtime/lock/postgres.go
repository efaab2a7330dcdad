package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres returns the PostgreSQL [Backend]: leases are rows of saga_locks
// (a runtime migration, applied by schema.Migrate), one per name, kept after
// release so the name's fencing token keeps growing. Expiry is judged by the
// database clock alone, so the clocks of the processes sharing a lock do not
// matter. Each call is one statement in its own transaction; none is held
// while the caller works.
func Postgres(pool *pgxpool.Pool) Backend { return postgresBackend{pool} }

// NewPostgres returns a Locker on the PostgreSQL backend of pool.
func NewPostgres(pool *pgxpool.Pool, cfg Config) (*Locker, error) {
	return New(Postgres(pool), cfg)
}

type postgresBackend struct{ pool *pgxpool.Pool }

func (postgresBackend) Name() string { return "postgres" }

// acquireSQL takes a free, expired or own lease; on a held one the WHERE
// fails and no row returns. ON CONFLICT locks the row and re-evaluates the
// condition, so concurrent callers serialize on it.
const acquireSQL = `INSERT INTO saga_locks AS l (name, owner, token, expires_at, acquired_at)
VALUES ($1, $2, 1, clock_timestamp() + $3 * interval '1 millisecond', clock_timestamp())
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = l.token + 1,
  expires_at = excluded.expires_at, acquired_at = excluded.acquired_at
WHERE l.owner = '' OR l.owner = excluded.owner OR l.expires_at <= clock_timestamp()
RETURNING token`

func (b postgresBackend) TryAcquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	var token int64
	err := b.pool.QueryRow(ctx, acquireSQL, name, owner, ttl.Milliseconds()).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrHeld
	}
	if err != nil {
		return 0, fmt.Errorf("take lease row: %w", err)
	}
	return token, nil
}

const extendSQL = `UPDATE saga_locks SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > clock_timestamp()`

func (b postgresBackend) Extend(ctx context.Context, name, owner string, token int64, ttl time.Duration) error {
	tag, err := b.pool.Exec(ctx, extendSQL, name, owner, token, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("extend lease row: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLost
	}
	return nil
}

// releaseSQL frees the owner's row, expired or not, and says whether it was
// still live.
const releaseSQL = `WITH old AS (
  SELECT expires_at > clock_timestamp() AS live FROM saga_locks
  WHERE name = $1 AND owner = $2 AND token = $3 FOR UPDATE
)
UPDATE saga_locks l SET owner = '', expires_at = least(l.expires_at, clock_timestamp())
FROM old WHERE l.name = $1 AND l.owner = $2 AND l.token = $3
RETURNING old.live`

func (b postgresBackend) Release(ctx context.Context, name, owner string, token int64) error {
	var live bool
	err := b.pool.QueryRow(ctx, releaseSQL, name, owner, token).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: another owner took it", ErrLost)
	}
	if err != nil {
		return fmt.Errorf("free lease row: %w", err)
	}
	if !live {
		return fmt.Errorf("%w: it had expired before the release (nobody took it since)", ErrLost)
	}
	return nil
}
