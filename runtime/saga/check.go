package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrStatesMismatch is matched by the error [Engine.CheckStates] returns
// when the instance table and the definition disagree on states.
var ErrStatesMismatch = errors.New("the saga table does not match the definition's states")

// errRollBack ends CheckStates' probing transaction without committing.
var errRollBack = errors.New("roll back")

// CheckStates compares the instance table with the engine's definition and
// fails, wrapping [ErrStatesMismatch], when instances occupy states the
// definition does not have (an engine could not apply anything to them), or
// when the table's state constraint refuses one of the definition's states
// (the engine could not enter it). The states migration of a new definition
// checks the first when it applies; neither is checked again when a release
// whose states file is already applied runs again, as after a rollback. Call
// it at start-up, after schema.Migrate. It writes nothing: the constraint is
// probed with inserts in a transaction that is rolled back.
func (e *Engine) CheckStates(ctx context.Context) error {
	names := make([]string, len(e.def.States))
	for i, s := range e.def.States {
		names[i] = s.Name
	}
	var problems []string
	// The distinct states come from a walk of the state index (one probe
	// per state), so a large table is not scanned; only stray states are
	// counted.
	rows, err := e.cfg.Pool.Query(ctx, `WITH RECURSIVE s AS (
  (SELECT state FROM `+e.table+` ORDER BY state LIMIT 1)
  UNION ALL
  SELECT (SELECT t.state FROM `+e.table+` t WHERE t.state > s.state ORDER BY t.state LIMIT 1) FROM s WHERE s.state IS NOT NULL
)
SELECT s.state, (SELECT count(*) FROM `+e.table+` t WHERE t.state = s.state) FROM s
WHERE s.state IS NOT NULL AND s.state <> ALL($1::text[])
ORDER BY s.state`, names)
	if err != nil {
		return fmt.Errorf("saga %s: check states: %w", e.def.Name, err)
	}
	var (
		state string
		n     int64
		stray []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		stray = append(stray, fmt.Sprintf("%s (%d)", state, n))
		return nil
	}); err != nil {
		return fmt.Errorf("saga %s: check states: %w", e.def.Name, err)
	}
	if len(stray) > 0 {
		problems = append(problems, "instances in states the definition does not have: "+strings.Join(stray, ", ")+
			" (finish or resolve them with a release that has these states)")
	}
	var refused []string
	err = pgx.BeginFunc(ctx, e.cfg.Pool, func(tx pgx.Tx) error {
		for _, s := range names {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			id := uuid.NewString()
			_, err = sp.Exec(ctx, `INSERT INTO `+e.table+` (id, business_key, state, data) VALUES ($1, $2, $3, '\x')`,
				id, "saga-check-states-"+id, s)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23514" {
				refused = append(refused, s)
			} else if err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
		}
		return errRollBack
	})
	if err != nil && !errors.Is(err, errRollBack) {
		return fmt.Errorf("saga %s: check states: %w", e.def.Name, err)
	}
	if len(refused) > 0 {
		problems = append(problems, "states of the definition its state constraint refuses: "+strings.Join(refused, ", ")+
			" (the constraint is a later release's: set it to this release's states, the ALTER TABLE statements of its states migration)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("saga %s: table %s: %s: %w", e.def.Name, e.def.Table, strings.Join(problems, "; "), ErrStatesMismatch)
	}
	return nil
}
