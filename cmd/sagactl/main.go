// Command sagactl operates a protoc-gen-saga deployment: it applies
// migrations and prunes old outbox rows and inbox claims in the database,
// and it finds, explains and repairs sagas and parked messages through the
// admin API (package runtime/admin) of a running service.
//
//	sagactl migrate [-database-url URL] [-source NAME=DIR]... [-participant] [-status]
//	sagactl export-migrations -dir DIR -format goose|golang-migrate [-source NAME=DIR]... [-participant] [-check]
//	sagactl prune [-database-url URL] [-outbox AGE] [-inbox AGE] [-once AGE] [-timeout D]
//	sagactl stats
//	sagactl search TEXT
//	sagactl log [--operator NAME] [--action A] [--limit N] [--all]
//	sagactl sagas list [--type T] [--state S] [--stuck] [--review] [--key K] [--prefix P] [--created-after T] [--created-before T] [--oldest] [--limit N] [--all]
//	sagactl sagas show ID [--type T]
//	sagactl sagas retry|compensate|cancel ID --reason WHY [--version N]
//	sagactl sagas resolve ID --to COMPLETED|FAILED|CANCELLED --reason WHY [--version N]
//	sagactl sagas retry|compensate|cancel|resolve --type/--state/--stuck/--review/--key ... --reason WHY [--dry-run] [--max N]
//	sagactl parked list [--saga-type T] [--saga ID] [--queue Q] [--message-type M] [--reason-has TEXT] [--older-than D] [--newer-than D] [--replayed] [--limit N] [--all]
//	sagactl parked show ID
//	sagactl parked replay ID --reason WHY [--dry-run] [--force]
//	sagactl parked replay --saga-type/--saga/--queue/--message-type/--reason-has ... --reason WHY [--dry-run] [--max N]
//	sagactl parked dismiss ID --reason WHY [--dry-run] [--force]
//	sagactl parked dismiss --saga-type/--saga/--queue/--message-type/--reason-has ... --reason WHY [--dry-run] [--max N]
//	sagactl callbacks list [--saga ID] [--status pending|delivered|parked] [--limit N]
//	sagactl callbacks replay ID --reason WHY
//
// Admin commands take --server URL (or $SAGACTL_SERVER) and --token TOKEN
// (or $SAGACTL_TOKEN), print human-readable tables, and print the API's JSON
// with --json. A repair without an ID acts on every saga (or parked message)
// matching its filter flags: run it with --dry-run first.
//
// migrate applies the runtime's migrations and then those of every source
// (a directory of ordered .sql files, such as the SQL protoc-gen-saga
// generates; -participant adds runtime/participant's), under an advisory
// lock, in one transaction; running it twice is a no-op. -status lists
// every migration and whether it is applied instead, with those the
// database recorded for sources not given. The database URL comes from
// -database-url, else SAGA_PG_URL, else DATABASE_URL; its password
// is never printed.
//
// export-migrations writes the same migrations into a goose or
// golang-migrate directory, each once, numbered after the highest version
// there (runtime/schema.Export); -check writes nothing and fails when one
// is missing.
//
// prune deletes, from the same database, outbox rows published longer ago
// than -outbox (never an unpublished one) and inbox claims received longer
// ago than -inbox (Go durations: 168h, not 7d), for every consumer at once.
// Running relays and consumers prune on their own (RelayConfig.KeepPublished,
// consumer.Config.KeepClaims); prune catches up by hand, or serves processes
// that keep rows (negative ages).
//
// Exit status: 0 on success, 1 when the command failed (including an API
// refusal such as a version conflict), 2 on a usage error (including a
// request the admin server refuses with 400 bad_request).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

const usage = `usage: sagactl <command> [flags]

commands:
  migrate        apply the runtime's and generated sagas' SQL migrations (-status to list them)
  export-migrations
                 write them into a goose or golang-migrate directory: -dir DIR -format F
  prune          delete old published outbox rows, inbox claims and once records: -outbox AGE, -inbox AGE, -once AGE
  stats          sagas per type and state (stuck ones too), open parked messages per queue
  search TEXT    sagas and parked messages by saga id, business key (or its start), message id, correlation id
  log            operator actions across sagas, newest first: --operator, --action
  sagas list     list sagas: --type, --state, --stuck, --review, --key, --prefix, --created-after/-before, --oldest
  sagas show     one saga's timeline and position: sagas show ID
  sagas retry|compensate|cancel ID --reason WHY
  sagas resolve ID --to STATE --reason WHY
                 repair one saga; without ID, every saga matching the filter flags (use --dry-run)
  parked list    list parked messages joined to their sagas
  parked show    one parked message with its (redacted) body: parked show ID
  parked replay ID --reason WHY
                 replay a parked message through the outbox; without ID, every match of the filters
  parked dismiss ID --reason WHY
                 close a parked copy that no longer applies; without ID, every superseded match of the filters
  callbacks list HTTP callbacks of the sagas' outcomes: --saga ID, --status pending|delivered|parked
  callbacks replay ID --reason WHY
                 send a parked callback again (same id, fresh retry budget)

admin commands need --server URL (or $SAGACTL_SERVER) and --token (or $SAGACTL_TOKEN);
--json prints the API's JSON. Run "sagactl <command> -h" for a command's flags.
`

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// usageError is a mistake in the command line (exit status 2). So is a
// request the admin server refuses as malformed (400 bad_request: a bad id,
// a limit out of range, a state the saga type does not have).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	name := args[0]
	switch {
	case isHelp(args[0]):
		fmt.Fprint(stdout, usage)
		return 0
	case args[0] == "migrate":
		err = migrate(ctx, args[1:], stdout, stderr, getenv)
	case args[0] == "export-migrations":
		err = exportMigrations(args[1:], stdout, stderr)
	case args[0] == "prune":
		err = prune(ctx, args[1:], stdout, stderr, getenv)
	case args[0] == "search", args[0] == "stats", args[0] == "log":
		err = findCommand(ctx, &cliEnv{stdout: stdout, stderr: stderr, getenv: getenv}, args[0], args[1:])
	case args[0] == "sagas", args[0] == "parked", args[0] == "callbacks":
		if len(args) < 2 {
			fmt.Fprintf(stderr, "sagactl %s: missing subcommand\n%s", args[0], usage)
			return 2
		}
		if isHelp(args[1]) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		name = args[0] + " " + args[1]
		env := &cliEnv{stdout: stdout, stderr: stderr, getenv: getenv}
		switch args[0] {
		case "sagas":
			err = sagasCommand(ctx, env, args[1], args[2:])
		case "parked":
			err = parkedCommand(ctx, env, args[1], args[2:])
		default:
			err = callbacksCommand(ctx, env, args[1], args[2:])
		}
	default:
		fmt.Fprintf(stderr, "sagactl: unknown command %q\n%s", args[0], usage)
		return 2
	}
	var ue *usageError
	var af *apiFailure
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue), errors.As(err, &af) && af.status == http.StatusBadRequest:
		fmt.Fprintf(stderr, "sagactl %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "sagactl %s: %v\n", name, err)
		return 1
	}
}
