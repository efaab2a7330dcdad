package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Liveness: a running relay holds a session-level advisory lock named
// after its owner on its LISTEN connection. PostgreSQL releases it when
// that session ends, which it does when the process dies (the kernel
// closes the socket). Other relays periodically look for rows leased to
// owners whose lock nobody holds and release them at once, instead of
// waiting for the lease to run out: a crash between a consumer's commit and
// the hand-off, or a relay killed with rows claimed, then delays those
// messages by about PollInterval rather than LeaseDuration.
//
// Safety does not depend on the lock. Releasing the rows of a relay that is
// in fact alive but without its lock (its LISTEN session was cut and is
// being re-established, or it is starting and has not taken it yet — it
// waits up to a poll for that before claiming, and accepts hand-offs
// meanwhile) can only make another relay publish them too: a duplicate with
// the same message id that consumers' inboxes drop, exactly as when a
// lease runs out. When the death cannot be told (the lock was never taken,
// or a dead process's session lingers until TCP notices), the lease still
// bounds the wait.

// livenessLockPrefix namespaces the advisory lock keys of relay owners:
// the key is hashtextextended(prefix || owner, 0).
const livenessLockPrefix = "protosaga.outbox.relay:"

// lockLiveness takes the owner's liveness lock on conn, the relay's LISTEN
// connection, and reports whether it holds it. Another session holding it
// (a relay configured with the same Owner, or this relay's previous
// session not yet ended) is not an error: the relay runs without it.
func (r *Relay) lockLiveness(ctx context.Context, conn *pgx.Conn) bool {
	var held bool
	err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1::text || $2::text, 0))`,
		livenessLockPrefix, r.cfg.Owner).Scan(&held)
	switch {
	case err != nil:
		r.cfg.Logger.Warn("outbox relay: could not take the liveness lock; after a crash its rows wait for their lease",
			"owner", r.cfg.Owner, "lease", r.cfg.LeaseDuration, "error", err)
	case !held:
		r.cfg.Logger.Warn("outbox relay: another session holds this owner's liveness lock (a relay with the same Owner, or this relay's previous connection); after a crash its rows wait for their lease",
			"owner", r.cfg.Owner, "lease", r.cfg.LeaseDuration)
	}
	return err == nil && held
}

// reapSQL releases the rows leased to owners whose liveness lock no
// session holds ($1 is this relay's owner, $2 the lock prefix); the
// command tag counts them. The locks are taken for the statement's
// transaction only. Owners whose leases ran out are left to the claim,
// which takes those rows anyway.
const reapSQL = `
WITH owners AS (
  SELECT DISTINCT lease_owner AS owner FROM saga_outbox
  WHERE published_at IS NULL AND lease_owner IS NOT NULL AND lease_owner <> $1 AND lease_until > now()
), gone AS MATERIALIZED (
  SELECT owner FROM owners WHERE pg_try_advisory_xact_lock(hashtextextended($2::text || owner, 0))
)
UPDATE saga_outbox o SET lease_owner = NULL, lease_until = NULL
FROM gone WHERE o.lease_owner = gone.owner AND o.published_at IS NULL`

// reap releases the rows of relays that are gone (see reapSQL) and reports
// how many it released.
func (r *Relay) reap(ctx context.Context) (int64, error) {
	tag, err := r.cfg.Pool.Exec(ctx, reapSQL, r.cfg.Owner, livenessLockPrefix)
	if err != nil {
		return 0, fmt.Errorf("release the rows of relays that are gone: %w", err)
	}
	n := tag.RowsAffected()
	if n > 0 {
		r.cfg.Logger.Info("outbox relay: released the rows of relays that are gone (no session holds their liveness lock)",
			"owner", r.cfg.Owner, "rows", n)
	}
	return n, nil
}
