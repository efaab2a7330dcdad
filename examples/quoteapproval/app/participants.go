package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	pricingv1 "github.com/protosaga/saga/examples/quoteapproval/pricing/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// journal records one business effect in quote_ledger, in the effect's
// transaction. Inside a participant nothing reads it back, so it is deferred
// (sent with the reply); elsewhere it runs at once.
func journal(ctx context.Context, tx pgx.Tx, quoteID, service, effect, detail string) error {
	return participant.Defer(ctx, tx, fmt.Sprintf("%s: journal %s of quote %s", service, effect, quoteID),
		`INSERT INTO quote_ledger (quote_id, service, effect, detail) VALUES ($1, $2, $3, $4)`,
		quoteID, service, effect, detail)
}

// Pricing is the pricing service: it prices a quote at a published price
// version and holds that price until the quote is ordered or withdrawn.
type Pricing struct{}

var _ pricingv1.PricingParticipant = Pricing{}

// PriceQuote holds the price of the quote's price version, or answers
// QuotePricingFailed (a business failure) for a version never published.
func (Pricing) PriceQuote(ctx context.Context, tx pgx.Tx, cmd *pricingv1.PriceQuote) (pricingv1.PriceQuoteResult, error) {
	quoteID, version := cmd.GetQuoteId(), cmd.GetPriceVersion()
	var currency string
	var minorUnits int64
	err := tx.QueryRow(ctx, `SELECT currency, minor_units FROM pricing_price_versions WHERE price_version = $1`,
		version).Scan(&currency, &minorUnits)
	if errors.Is(err, pgx.ErrNoRows) {
		reason := fmt.Sprintf("price version %d is not published", version)
		if err := journal(ctx, tx, quoteID, "pricing", "refused", reason); err != nil {
			return nil, err
		}
		return &pricingv1.QuotePricingFailed{QuoteId: quoteID, Reason: reason}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pricing: read price version %d for quote %s: %w", version, quoteID, err)
	}
	if err := participant.Defer(ctx, tx, "pricing: hold the price of quote "+quoteID,
		`INSERT INTO pricing_holds (quote_id, price_version, currency, minor_units) VALUES ($1, $2, $3, $4)`,
		quoteID, version, currency, minorUnits); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, quoteID, "pricing", "held", fmt.Sprintf("%d %s", minorUnits, currency)); err != nil {
		return nil, err
	}
	return &pricingv1.QuotePriced{QuoteId: quoteID, PriceMinorUnits: minorUnits, Currency: currency}, nil
}

// ReleasePrice releases the price held for the quote. Releasing a quote
// that holds nothing succeeds: there is nothing left to undo.
func (Pricing) ReleasePrice(ctx context.Context, tx pgx.Tx, cmd *pricingv1.ReleasePrice) (pricingv1.ReleasePriceResult, error) {
	quoteID := cmd.GetQuoteId()
	tag, err := tx.Exec(ctx, `UPDATE pricing_holds SET released_at = now() WHERE quote_id = $1 AND released_at IS NULL`, quoteID)
	if err != nil {
		return nil, fmt.Errorf("pricing: release the price of quote %s: %w", quoteID, err)
	}
	effect := "released"
	if tag.RowsAffected() == 0 {
		effect = "released_nothing"
	}
	if err := journal(ctx, tx, quoteID, "pricing", effect, ""); err != nil {
		return nil, err
	}
	return &pricingv1.PriceReleased{QuoteId: quoteID}, nil
}

// Ordering is the ordering service: it turns an approved quote into an order.
// Its step comes after the approval (the pivot), so it has no business
// failure to answer with: it submits, or returns an error and is retried.
type Ordering struct{}

var _ quotev1.OrderingParticipant = Ordering{}

// SubmitOrder creates the order at the quote's held price.
func (Ordering) SubmitOrder(ctx context.Context, tx pgx.Tx, cmd *quotev1.SubmitOrder) (quotev1.SubmitOrderResult, error) {
	quoteID := cmd.GetQuoteId()
	if cmd.GetPriceMinorUnits() <= 0 || cmd.GetCurrency() == "" {
		// Retrying cannot help: park the command for an operator.
		return nil, retry.Permanent(fmt.Errorf("ordering: quote %s has no price (%d %q)",
			quoteID, cmd.GetPriceMinorUnits(), cmd.GetCurrency()))
	}
	orderID := "ord_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, "ordering: submit the order of quote "+quoteID,
		`INSERT INTO ordering_orders (order_id, quote_id, customer_id, currency, minor_units) VALUES ($1, $2, $3, $4, $5)`,
		orderID, quoteID, cmd.GetCustomerId(), cmd.GetCurrency(), cmd.GetPriceMinorUnits()); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, quoteID, "ordering", "submitted", orderID); err != nil {
		return nil, err
	}
	return &quotev1.OrderSubmitted{QuoteId: quoteID, OrderId: orderID}, nil
}
