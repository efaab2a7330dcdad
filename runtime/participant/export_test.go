package participant

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
)

// ClaimAhead claims the keys BatchHandler claims ahead for ds, without
// handling them.
func ClaimAhead(ctx context.Context, tx pgx.Tx, service string, ds []*consumer.Delivery) error {
	return claimAhead(ctx, tx, service, ds)
}
