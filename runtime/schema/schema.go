// Package schema owns the runtime's tables (outbox, inbox, audit, parked
// messages) as embedded, versioned SQL migrations, and applies them together
// with the migrations generated for each saga.
//
// # Design
//
// Migrations are plain .sql files, applied in file-name order. The runtime's
// own files are embedded in this package (migrations/NNNN_name.sql) and
// recorded by version in saga_schema_migrations; every other set of files is
// a [Source] (a name and an fs.FS, typically generated code's embedded
// migrations) recorded by (source, file name) in saga_schema_sources. Both
// tables store a SHA-256 checksum of each applied file.
//
// # Invariants
//
//   - Applying is idempotent: [Migrate] applies only files not yet recorded,
//     so a second run is a no-op.
//   - Appliers serialize: one Migrate call runs in one transaction that first
//     takes a transaction-scoped advisory lock keyed on the current schema
//     (pg_advisory_xact_lock), so concurrent processes starting at once apply
//     each file exactly once and the others see the result.
//   - All or nothing: every pending file of one call is applied in that one
//     transaction; a failing file rolls back the whole call.
//   - History is immutable: a file whose checksum differs from the one
//     recorded when it was applied is refused with [ErrChanged] before
//     anything is applied. Change a schema by adding a file, never by
//     editing one.
//
// Tables are created unqualified, in the first schema of the connection's
// search_path (current_schema()); the advisory lock is per schema, so
// separate schemas migrate independently.
//
// # Migration tools
//
// [Export] writes the same files into a goose or golang-migrate directory,
// for teams that apply every migration with their own tool. Those tools
// record versions, not names, and a version is history: which files came
// before. A source knows only its current files (a changed state set is a
// new, hash-named states file), so Export numbers each file it has not
// exported yet after the highest version already in the directory, and
// marks it with the migration it carries so that the next Export writes
// only what is new. A database is migrated by one tool: the tools do not
// read Migrate's records, and Migrate and Status refuse a database whose
// runtime tables exist without them ([ErrOtherTool]).
package schema

import (
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var runtimeFS embed.FS

// RuntimeSource is the source name [Status] reports for the runtime's own
// migrations. No [Source] may use it.
const RuntimeSource = "runtime"

// lockClass is the first key of the advisory lock Migrate holds; the second
// is a hash of the current schema's name.
const lockClass = 0x73616761 // "saga"

// ErrChanged is matched by the error Migrate returns when an applied
// migration file's content changed.
var ErrChanged = errors.New("applied migration was changed")

// ErrOtherTool is matched by the error Migrate and Status return on a
// database whose runtime tables exist without Migrate's records of them:
// another tool (goose, golang-migrate, applying the files [Export] wrote)
// migrates it.
var ErrOtherTool = errors.New("the runtime's tables exist but saga_schema_migrations does not: another tool (goose, golang-migrate) migrates this database; use that tool")

// otherToolQuery is true where ErrOtherTool applies.
const otherToolQuery = "SELECT to_regclass('saga_outbox') IS NOT NULL AND to_regclass('saga_schema_migrations') IS NULL"

// checkOtherTool returns ErrOtherTool where it applies.
func checkOtherTool(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var other bool
	if err := q.QueryRow(ctx, otherToolQuery).Scan(&other); err != nil {
		return fmt.Errorf("look for the runtime's tables: %w", err)
	}
	if other {
		return ErrOtherTool
	}
	return nil
}

// Source is a named set of migrations: the .sql files at the root of FS,
// applied in file-name order (name them 0001_…, 0002_…). Name must be
// stable: it is recorded with every applied file.
type Source struct {
	Name string
	FS   fs.FS
}

// Migration is one migration file and whether it has been applied.
type Migration struct {
	// Source is RuntimeSource or the name of a Source.
	Source string
	// Name is the file name.
	Name string
	// Version is the numeric prefix of a runtime migration (0 for sources).
	Version int
	// Checksum is the hex SHA-256 of the file's content.
	Checksum string
	// Applied reports whether the file has been applied; AppliedAt when.
	Applied   bool
	AppliedAt time.Time
	// Changed reports an applied file whose content differs from what was
	// applied (Migrate refuses to run until it is restored).
	Changed bool
	// NoFile reports a migration the database recorded as applied that is
	// not among the files given to [Status]: one of a source not passed to
	// it, one no longer in its source (the states file of an earlier state
	// set), or a runtime migration of a newer release. Checksum is the
	// recorded one.
	NoFile bool

	sql string
}

// Migrate applies every pending runtime migration, then every pending file
// of sources in the order given, in one transaction under an advisory lock.
// It returns an error wrapping ErrChanged, and applies nothing, when an
// applied file changed.
func Migrate(ctx context.Context, pool *pgxpool.Pool, sources ...Source) error {
	return migrate(ctx, pool, math.MaxInt, sources)
}

// migrate is Migrate applying the runtime's migrations only up to version
// last (tests build a database as an older release left it).
func migrate(ctx context.Context, pool *pgxpool.Pool, last int, sources []Source) error {
	files, err := load(sources)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))", int32(lockClass)); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if err := checkOtherTool(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, bookkeepingDDL); err != nil {
			return fmt.Errorf("create migration tables: %w", err)
		}
		if _, err := markApplied(ctx, tx, files); err != nil {
			return err
		}
		if err := checkChanged(files); err != nil {
			return err
		}
		for _, m := range files {
			if m.Applied || m.Source == RuntimeSource && m.Version > last {
				continue
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Hint != "" {
					return fmt.Errorf("apply migration %s/%s: %w (hint: %s)", m.Source, m.Name, err, pgErr.Hint)
				}
				return fmt.Errorf("apply migration %s/%s: %w", m.Source, m.Name, err)
			}
			if m.Source == RuntimeSource {
				_, err = tx.Exec(ctx, "INSERT INTO saga_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.Version, m.Name, m.Checksum)
			} else {
				_, err = tx.Exec(ctx, "INSERT INTO saga_schema_sources (source, name, checksum) VALUES ($1, $2, $3)", m.Source, m.Name, m.Checksum)
			}
			if err != nil {
				return fmt.Errorf("record migration %s/%s: %w", m.Source, m.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Status lists the runtime migrations and those of sources, in the order
// Migrate applies them, with whether each is applied or changed, and every
// other migration the database recorded as applied (NoFile): those of
// sources not given, after the given ones, by source name. It does not
// take the migration lock and creates nothing.
func Status(ctx context.Context, pool *pgxpool.Pool, sources ...Source) ([]Migration, error) {
	files, err := load(sources)
	if err != nil {
		return nil, err
	}
	if err := checkOtherTool(ctx, pool); err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('saga_schema_migrations') IS NOT NULL AND to_regclass('saga_schema_sources') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	if exists {
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			recorded, err := markApplied(ctx, tx, files)
			files = append(files, recorded...)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("migration status: %w", err)
		}
	}
	// Runtime first, then the sources given in their order, then the others
	// by name; within a source, by version (runtime) or file name.
	rank := map[string]int{RuntimeSource: 0}
	for i, s := range sources {
		rank[s.Name] = i + 1
	}
	group := func(m *Migration) int {
		if r, ok := rank[m.Source]; ok {
			return r
		}
		return len(sources) + 1
	}
	slices.SortStableFunc(files, func(a, b *Migration) int {
		if c := cmp.Compare(group(a), group(b)); c != 0 {
			return c
		}
		if c := strings.Compare(a.Source, b.Source); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Version, b.Version); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	out := make([]Migration, len(files))
	for i, m := range files {
		out[i] = *m
		out[i].sql = ""
	}
	return out, nil
}

const bookkeepingDDL = `
CREATE TABLE IF NOT EXISTS saga_schema_migrations (
  version integer PRIMARY KEY,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS saga_schema_sources (
  source text NOT NULL,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (source, name)
);`

// load reads the runtime migrations and those of sources, in apply order.
func load(sources []Source) ([]*Migration, error) {
	sub, err := fs.Sub(runtimeFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("runtime migrations: %w", err)
	}
	files, err := readSource(RuntimeSource, sub)
	if err != nil {
		return nil, err
	}
	seenVersion := map[int]string{}
	for _, m := range files {
		prefix, _, _ := strings.Cut(m.Name, "_")
		v, err := strconv.Atoi(prefix)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("runtime migration %s: name must start with a positive version number", m.Name)
		}
		if prev, ok := seenVersion[v]; ok {
			return nil, fmt.Errorf("runtime migrations %s and %s share version %d", prev, m.Name, v)
		}
		seenVersion[v] = m.Name
		m.Version = v
	}
	seen := map[string]bool{}
	for i, s := range sources {
		switch {
		case s.Name == "":
			return nil, fmt.Errorf("migration source %d: empty name", i)
		case s.Name == RuntimeSource:
			return nil, fmt.Errorf("migration source %d: name %q is reserved for the runtime's migrations", i, s.Name)
		case seen[s.Name]:
			return nil, fmt.Errorf("migration source %q given twice", s.Name)
		case s.FS == nil:
			return nil, fmt.Errorf("migration source %q: nil FS", s.Name)
		}
		seen[s.Name] = true
		ms, err := readSource(s.Name, s.FS)
		if err != nil {
			return nil, err
		}
		files = append(files, ms...)
	}
	return files, nil
}

// readSource reads the .sql files at the root of fsys in name order.
func readSource(source string, fsys fs.FS) ([]*Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migration source %q: %w", source, err)
	}
	var out []*Migration
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
			continue
		}
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s/%s: %w", source, e.Name(), err)
		}
		sum := sha256.Sum256(b)
		out = append(out, &Migration{Source: source, Name: e.Name(), Checksum: hex.EncodeToString(sum[:]), sql: string(b)})
	}
	if len(out) == 0 {
		hint := ""
		if len(dirs) > 0 {
			hint = fmt.Sprintf(" (it holds the directories %v: give the directory itself, e.g. fs.Sub(fsys, %q))", dirs, dirs[0])
		}
		return nil, fmt.Errorf("migration source %q has no .sql files at its root%s", source, hint)
	}
	slices.SortFunc(out, func(a, b *Migration) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// markApplied fills Applied, AppliedAt and Changed from the bookkeeping
// tables, and returns the migrations recorded there that files lack
// (NoFile).
func markApplied(ctx context.Context, tx pgx.Tx, files []*Migration) ([]*Migration, error) {
	type key struct{ source, name string }
	byKey := make(map[key]*Migration, len(files))
	byVersion := map[int]*Migration{}
	for _, m := range files {
		if m.Source == RuntimeSource {
			byVersion[m.Version] = m
		} else {
			byKey[key{m.Source, m.Name}] = m
		}
	}
	var recorded []*Migration
	apply := func(m *Migration, checksum string, at time.Time) {
		m.Applied, m.AppliedAt, m.Changed = true, at, checksum != m.Checksum
	}

	rows, err := tx.Query(ctx, "SELECT version, name, checksum, applied_at FROM saga_schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read applied runtime migrations: %w", err)
	}
	var (
		version      int
		source, name string
		checksum     string
		at           time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&version, &name, &checksum, &at}, func() error {
		if m := byVersion[version]; m != nil {
			apply(m, checksum, at)
		} else { // applied by a newer release
			recorded = append(recorded, &Migration{Source: RuntimeSource, Name: name, Version: version, Checksum: checksum, Applied: true, AppliedAt: at, NoFile: true})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read applied runtime migrations: %w", err)
	}

	rows, err = tx.Query(ctx, "SELECT source, name, checksum, applied_at FROM saga_schema_sources")
	if err != nil {
		return nil, fmt.Errorf("read applied source migrations: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&source, &name, &checksum, &at}, func() error {
		if m := byKey[key{source, name}]; m != nil {
			apply(m, checksum, at)
		} else {
			recorded = append(recorded, &Migration{Source: source, Name: name, Checksum: checksum, Applied: true, AppliedAt: at, NoFile: true})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read applied source migrations: %w", err)
	}
	return recorded, nil
}

// checkChanged returns an error naming every applied file that changed.
func checkChanged(files []*Migration) error {
	var errs []error
	for _, m := range files {
		if m.Changed {
			errs = append(errs, fmt.Errorf("migration %s/%s was applied at %s with different content (now sha256 %s); restore it and add a new migration file instead",
				m.Source, m.Name, m.AppliedAt.UTC().Format(time.RFC3339), m.Checksum[:12]))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrChanged, errors.Join(errs...))
}
