package participant

import (
	"embed"

	"github.com/protosaga/saga/runtime/schema"
)

//go:embed *.sql
var migrationsFS embed.FS

// Migrations holds the tables this package needs (saga_participant_once).
// Apply them with the runtime's: schema.Migrate(ctx, pool, participant.Migrations).
var Migrations = schema.Source{Name: "participant", FS: migrationsFS}
