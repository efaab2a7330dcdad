package app

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	pricingv1 "github.com/protosaga/saga/examples/quoteapproval/pricing/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/schema"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations holds the example services' own tables (price versions, held
// prices, approval decisions, orders and the quote_ledger journal).
func Migrations() schema.Source {
	sub, _ := fs.Sub(migrationsFS, "migrations") // a constant directory of the embedded tree
	return schema.Source{Name: "quoteapproval", FS: sub}
}

// Register registers the whole Quote Approval example on h: the services'
// tables, the pricing and ordering participants and the saga. In production
// each service registers its own part on a host of its own.
func Register(h *host.Host) (*quotev1.QuoteApproval, error) {
	err := errors.Join(
		h.AddMigrations(Migrations()),
		pricingv1.RegisterPricingParticipant(h, Pricing{}),
		quotev1.RegisterOrderingParticipant(h, Ordering{}),
	)
	if err != nil {
		return nil, err
	}
	return quotev1.RegisterQuoteApproval(h, Decider{})
}

// SetPriceVersion publishes (or changes) price version version: the price
// pricing holds for a quote priced at it.
func SetPriceVersion(ctx context.Context, pool *pgxpool.Pool, version int64, currency string, minorUnits int64) error {
	if _, err := pool.Exec(ctx, `INSERT INTO pricing_price_versions (price_version, currency, minor_units) VALUES ($1, $2, $3)
ON CONFLICT (price_version) DO UPDATE SET currency = EXCLUDED.currency, minor_units = EXCLUDED.minor_units`,
		version, currency, minorUnits); err != nil {
		return fmt.Errorf("publish price version %d: %w", version, err)
	}
	return nil
}
