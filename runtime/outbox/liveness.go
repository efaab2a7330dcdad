package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Liveness: a running relay holds a session-level advisory lock named
// after its schema and owner on its LISTEN connection, and, once it holds
// it, registers in saga_outbox_relays. PostgreSQL releases the lock when
// the session ends, which it does when the process dies (the kernel closes
// the socket). Every relay looks at the registered owners about once per
// PollInterval; an owner whose lock has been free for reapGrace (seen free
// on two looks at least that far apart) is gone: its leased rows are
// released for any relay to claim and its registration is deleted. So the
// rows of a relay killed with rows claimed, or of a process killed between
// a consumer's commit and the hand-off, wait a few polls instead of
// LeaseDuration.
//
// Safety does not depend on the lock. Releasing the rows of a relay that is
// in fact alive can only make another relay publish them too: a duplicate
// with the same message id that consumers' inboxes drop, as when a lease
// runs out. That needs its LISTEN session to be gone for longer than
// reapGrace while it runs on (the listener reconnects within a poll once
// PostgreSQL answers, and takes the lock and registers again). A relay
// that does not hold its lock is not registered and is never released this
// way: its rows wait for their lease, as before, and it tries again every
// poll. Behind a pooler in transaction mode (PgBouncer) neither LISTEN nor
// session locks work: give relays a direct or session-mode connection.

// livenessLockPrefix namespaces the advisory lock keys of relay owners:
// the key is hashtextextended(prefix || current_schema() || ':' || owner, 0),
// so relays of outboxes in different schemas of one database never share
// a key.
const livenessLockPrefix = "protosaga.outbox.relay:"

// reapGrace is how long an owner's lock must stay free before its rows
// are released: three polls, so a relay whose LISTEN connection is being
// re-established (at most a poll apart) is not taken for dead.
func (r *Relay) reapGrace() time.Duration { return 3 * r.cfg.PollInterval }

const lockLivenessSQL = `SELECT pg_try_advisory_lock(hashtextextended($1::text || current_schema() || ':' || $2::text, 0))`

// registerSQL records the relay as running; it runs once the relay holds
// its lock.
const registerSQL = `INSERT INTO saga_outbox_relays (owner) VALUES ($1)
ON CONFLICT (owner) DO UPDATE SET registered_at = now(), free_since = NULL`

// lockLiveness takes the owner's liveness lock on conn, the relay's LISTEN
// connection, and registers the relay once it holds it. It reports whether
// the relay holds the lock and is registered. Another session holding the
// lock (a relay with the same Owner, this relay's previous session not yet
// ended, or another relay's look at it) is no error: the listener tries
// again every poll.
func (r *Relay) lockLiveness(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var held bool
	if err := conn.QueryRow(ctx, lockLivenessSQL, livenessLockPrefix, r.cfg.Owner).Scan(&held); err != nil {
		return false, fmt.Errorf("take the liveness lock: %w", err)
	}
	if !held {
		return false, nil
	}
	if _, err := conn.Exec(ctx, registerSQL, r.cfg.Owner); err != nil {
		return false, fmt.Errorf("register in saga_outbox_relays: %w", err)
	}
	return true, nil
}

// unregister deletes the relay's registration when it stops; its lock goes
// with its LISTEN connection.
func (r *Relay) unregister(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ConfirmTimeout)
	defer cancel()
	if _, err := r.cfg.Pool.Exec(ctx, `DELETE FROM saga_outbox_relays WHERE owner = $1`, r.cfg.Owner); err != nil {
		r.cfg.Logger.Warn("outbox relay: could not delete its registration; other relays delete it once its lock is free",
			"owner", r.cfg.Owner, "error", err)
	}
}

// lookSQL lists the other registered owners with whether their lock is
// free now (taken for this transaction only, so a relay coming back cannot
// take it until the look is over) and whether it was already free for
// reapGrace ($3, in milliseconds).
const lookSQL = `
WITH others AS MATERIALIZED (
  SELECT owner, free_since FROM saga_outbox_relays WHERE owner <> $1
)
SELECT owner,
  pg_try_advisory_xact_lock(hashtextextended($2::text || current_schema() || ':' || owner, 0)) AS free,
  free_since IS NOT NULL AS was_free,
  coalesce(free_since <= now() - $3 * interval '1 millisecond', false) AS due
FROM others ORDER BY owner`

// releaseGoneSQL releases the leased rows of gone owners and deletes their
// registrations, returning how many rows of each owner it released.
const releaseGoneSQL = `
WITH forgotten AS (
  DELETE FROM saga_outbox_relays WHERE owner = ANY($1)
), released AS (
  UPDATE saga_outbox o SET lease_owner = NULL, lease_until = NULL
  FROM unnest($1::text[]) AS g(owner)
  WHERE o.lease_owner = g.owner AND o.published_at IS NULL
  RETURNING g.owner
)
SELECT owner, count(*) FROM released GROUP BY owner`

// reap looks at the other registered relays (see lookSQL) and releases the
// rows of those that are gone. It returns how many rows it released.
func (r *Relay) reap(ctx context.Context) (int, error) {
	released := map[string]int{}
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, lookSQL, r.cfg.Owner, livenessLockPrefix, r.reapGrace().Milliseconds())
		if err != nil {
			return err
		}
		var (
			owner              string
			free, wasFree, due bool
			gone, freed, back  []string
		)
		_, err = pgx.ForEachRow(rows, []any{&owner, &free, &wasFree, &due}, func() error {
			switch {
			case free && due:
				gone = append(gone, owner)
			case free && !wasFree:
				freed = append(freed, owner)
			case !free && wasFree:
				back = append(back, owner)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(freed) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE saga_outbox_relays SET free_since = now() WHERE owner = ANY($1)`, freed); err != nil {
				return err
			}
		}
		if len(back) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE saga_outbox_relays SET free_since = NULL WHERE owner = ANY($1)`, back); err != nil {
				return err
			}
		}
		if len(gone) == 0 {
			return nil
		}
		for _, o := range gone {
			released[o] = 0
		}
		rows, err = tx.Query(ctx, releaseGoneSQL, gone)
		if err != nil {
			return err
		}
		var n int
		_, err = pgx.ForEachRow(rows, []any{&owner, &n}, func() error {
			released[owner] = n
			return nil
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("look for relays that are gone: %w", err)
	}
	total := 0
	for o, n := range released {
		total += n
		r.cfg.Logger.Warn("outbox relay: released the rows of a relay that is gone (its liveness lock was free for the grace period)",
			"owner", r.cfg.Owner, "gone", o, "rows", n, "grace", r.reapGrace())
	}
	return total, nil
}
