package participant

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/consumer"
)

// ReadAhead reads the records BatchHandler reads ahead for ds, without
// handling them.
func ReadAhead(ctx context.Context, tx pgx.Tx, service string, ds []*consumer.Delivery) error {
	return readAhead(ctx, tx, service, ds)
}
