package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/outbox"
)

// prune deletes published outbox rows and inbox claims older than the ages
// given, straight in the database (like migrate, not through the admin API).
func prune(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default $SAGA_DATABASE_URL, then $DATABASE_URL)")
	outboxAge := fs.Duration("outbox", 0, "delete outbox rows published longer ago than this, e.g. 168h (0: keep all)")
	inboxAge := fs.Duration("inbox", 0, "delete inbox claims received longer ago than this, e.g. 720h (0: keep all); "+
		"a message redelivered after its claim is gone is handled again")
	timeout := fs.Duration("timeout", time.Hour, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected arguments %q", fs.Args())
	case *outboxAge < 0 || *inboxAge < 0:
		return usagef("ages must not be negative")
	case *outboxAge == 0 && *inboxAge == 0:
		return usagef("pass -outbox AGE, -inbox AGE or both")
	case *timeout <= 0:
		return usagef("-timeout must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, u, err := openDatabase(ctx, *dbURL, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	now := time.Now()
	if *outboxAge > 0 {
		before := now.Add(-*outboxAge)
		n, err := outbox.Prune(ctx, pool, before)
		if err != nil {
			return fmt.Errorf("%s: %w (%d deleted before the failure)", redact(u), err, n)
		}
		fmt.Fprintf(stdout, "outbox: deleted %d rows published before %s\n", n, before.UTC().Format(time.RFC3339))
	}
	if *inboxAge > 0 {
		before := now.Add(-*inboxAge)
		n, err := inbox.Prune(ctx, pool, before)
		if err != nil {
			return fmt.Errorf("%s: %w (%d deleted before the failure)", redact(u), err, n)
		}
		fmt.Fprintf(stdout, "inbox: deleted %d claims received before %s\n", n, before.UTC().Format(time.RFC3339))
	}
	return nil
}
