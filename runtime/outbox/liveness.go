package outbox

import (
	"context"
	"fmt"
	"log/slog"
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
// runs out. That needs its LISTEN session to be gone for longer than its
// grace while it runs on (the listener reconnects at most a poll apart once
// PostgreSQL answers, then takes the lock and registers again; a session
// that died silently is found by the health check within ~20 s, which a
// partition shorter than that does not outlast). A relay that does not hold
// its lock is not registered and is never released this way: its rows wait
// for their lease, as before, and it tries again every poll. On a clean
// stop a relay finishes its rows, deletes its registration, and only then
// lets go of the lock. Behind a pooler in transaction mode (PgBouncer) neither LISTEN nor
// session locks work: give relays a direct or session-mode connection.

// livenessLockPrefix namespaces the advisory lock keys of relay owners:
// the key is hashtextextended(prefix || current_schema() || ':' || owner, 0),
// so relays of outboxes in different schemas of one database never share
// a key.
const livenessLockPrefix = "protosaga.outbox.relay:"

// reapGrace is how long this relay's lock must stay free before other
// relays release its rows (recorded with its registration): three of its
// polls, so that it is not taken for dead while its LISTEN connection is
// re-established (at most a poll apart). A look uses the longer of its own
// grace and the registered one.
func (r *Relay) reapGrace() time.Duration { return 3 * r.cfg.PollInterval }

// lockKeySQL is the relay's lock key: its schema and owner, so that relays
// of outboxes in different schemas of one database never share a key.
const lockKeySQL = `SELECT hashtextextended($1::text || current_schema() || ':' || $2::text, 0)`

// registerSQL records the relay as running; it runs while the relay holds
// its lock (and again at each health check, so a lost row comes back).
const registerSQL = `INSERT INTO saga_outbox_relays (owner, lock_key, grace_ms) VALUES ($1, $2, $3)
ON CONFLICT (owner) DO UPDATE SET lock_key = $2, grace_ms = $3, free_since = NULL`

// unregisterSQL deletes the registration on a clean stop, sent on the
// connection that holds the lock (so it never deletes the row of another
// relay that has the same Owner and the lock).
const unregisterSQL = `DELETE FROM saga_outbox_relays WHERE owner = $1 AND lock_key = $2`

// lookSQL lists the other registered owners with whether their lock is
// free now and whether it was already free for the grace ($2 ms, or the
// owner's own if longer). The lock is tried shared and for this
// transaction only: looks of several relays do not see each other as the
// owner, and a relay coming back cannot take its lock until the look is
// over (it tries again a poll later).
const lookSQL = `
WITH others AS MATERIALIZED (
  SELECT owner, lock_key, grace_ms, free_since FROM saga_outbox_relays WHERE owner <> $1
)
SELECT owner,
  pg_try_advisory_xact_lock_shared(lock_key) AS free,
  free_since IS NOT NULL AS was_free,
  coalesce(free_since <= now() - greatest($2, grace_ms) * interval '1 millisecond', false) AS due
FROM others ORDER BY owner`

// releaseGoneSQL releases the leased rows of gone owners and deletes their
// registrations, returning how many rows of each owner it released.
const releaseGoneSQL = `
WITH forgotten AS (
  DELETE FROM saga_outbox_relays WHERE owner = ANY($1)
), released AS (
  UPDATE saga_outbox_pending p SET lease_owner = NULL, lease_until = NULL
  FROM unnest($1::text[]) AS g(owner)
  WHERE p.lease_owner = g.owner
  RETURNING g.owner
)
SELECT owner, count(*) FROM released GROUP BY owner`

// reap looks at the other registered relays (see lookSQL) and releases the
// rows of those that are gone.
func (r *Relay) reap(ctx context.Context) error {
	released := map[string]int{}
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, lookSQL, r.cfg.Owner, r.reapGrace().Milliseconds())
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
		return fmt.Errorf("look for relays that are gone: %w", err)
	}
	for o, n := range released {
		r.tel.metrics.GoneRelayRowsReleased(ctx, n)
		level := slog.LevelWarn
		if n == 0 {
			level = slog.LevelInfo
		}
		r.cfg.Logger.Log(ctx, level, "outbox relay: released the rows of a relay that is gone (its liveness lock stayed free for its grace period)",
			"owner", r.cfg.Owner, "gone", o, "rows", n)
	}
	return nil
}
