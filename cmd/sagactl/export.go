package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/protosaga/saga/runtime/schema"
)

// exportMigrations writes the runtime's migrations and those of the sources
// into a goose or golang-migrate directory (schema.Export), or with -check
// fails when one is not there yet. It needs no database.
func exportMigrations(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export-migrations", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "the tool's migration directory (required); it may hold migrations of your own")
	format := fs.String("format", "", "the tool's file layout: goose or golang-migrate (required)")
	check := fs.Bool("check", false, "write nothing; fail when a migration is not exported yet (for CI, after buf generate)")
	var flags sourceFlags
	sources := flags.register(fs, "exported")
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("unexpected arguments %q", pos)
	case *dir == "":
		return usagef("-dir is required")
	case schema.Format(*format) != schema.Goose && schema.Format(*format) != schema.GolangMigrate:
		return usagef("-format must be %s or %s", schema.Goose, schema.GolangMigrate)
	}
	out, err := schema.Export(schema.ExportOptions{Dir: *dir, Format: schema.Format(*format), DryRun: *check}, sources()...)
	for _, e := range out {
		if *check {
			fmt.Fprintf(stdout, "not exported: %s/%s\n", e.Source, e.Name)
		} else {
			fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*dir, e.File))
		}
	}
	switch {
	case err != nil:
		return err
	case *check && len(out) > 0:
		return fmt.Errorf("%d migrations are not exported to %s: run sagactl export-migrations without -check and commit the files", len(out), *dir)
	case len(out) == 0:
		fmt.Fprintf(stdout, "%s is up to date\n", *dir)
	}
	return nil
}
