package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/inbox"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
)

// prune deletes published outbox rows, inbox claims and participants' once
// records older than the ages given, straight in the database (like migrate, not through the admin API).
func prune(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var db dbFlags
	db.register(fs, time.Hour)
	outboxAge := fs.Duration("outbox", 0, "delete outbox rows published longer ago than this, e.g. 168h (0: keep all)")
	inboxAge := fs.Duration("inbox", 0, "delete inbox claims received longer ago than this, e.g. 720h (0: keep all); "+
		"a message redelivered after its claim is gone is handled again")
	onceAge := fs.Duration("once", 0, "delete participants' once records written longer ago than this, e.g. 720h (0: keep all); "+
		"a command that comes again after its record is gone runs again")
	if err := db.parse(fs, args); err != nil {
		return err
	}
	switch {
	case *outboxAge < 0 || *inboxAge < 0 || *onceAge < 0:
		return usagef("ages must not be negative")
	case *outboxAge == 0 && *inboxAge == 0 && *onceAge == 0:
		return usagef("pass -outbox AGE, -inbox AGE, -once AGE, or several")
	}
	kinds := []struct {
		age    time.Duration
		report string // with the count and the cut
		prune  func(context.Context, *pgxpool.Pool, time.Time) (int64, error)
	}{
		{*outboxAge, "outbox: deleted %d rows published before %s\n", outbox.Prune},
		{*inboxAge, "inbox: deleted %d claims received before %s\n", inbox.Prune},
		{*onceAge, "once: deleted %d once records written before %s\n", participant.PruneAllOnce},
	}
	return db.run(ctx, getenv, func(ctx context.Context, pool *pgxpool.Pool, u string) error {
		now := time.Now()
		for _, k := range kinds {
			if k.age == 0 {
				continue
			}
			before := now.Add(-k.age)
			n, err := k.prune(ctx, pool, before)
			if err != nil {
				return fmt.Errorf("%s: %w (%d deleted before the failure)", redact(u), err, n)
			}
			fmt.Fprintf(stdout, k.report, n, before.UTC().Format(time.RFC3339))
		}
		return nil
	})
}
