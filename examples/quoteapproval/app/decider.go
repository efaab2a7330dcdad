package app

import (
	"context"
	"errors"
	"fmt"

	approvalv1 "github.com/protosaga/saga/examples/quoteapproval/approval/v1"
	pricingv1 "github.com/protosaga/saga/examples/quoteapproval/pricing/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/runtime/retry"
)

// Decider is the Quote Approval saga's business logic: the saga data a
// submitted quote starts with, each command built from that data, and what
// the replies, the approval and a cancel add to it. Sequencing, the wait for
// the approval, timeouts and compensation are the runtime's.
type Decider struct {
	quotev1.QuoteApprovalNoopFolds
}

var _ quotev1.QuoteApprovalDecider = Decider{}

// Start validates the submitted quote. An invalid one is a permanent
// failure: Start returns it to the caller and no saga begins. The
// customer's email (a sensitive field) stays out of the saga data.
func (Decider) Start(_ context.Context, q *quotev1.SubmitQuote) (*quotev1.QuoteApprovalData, error) {
	var errs []error
	if q.GetQuoteId() == "" {
		errs = append(errs, errors.New("quote_id is empty"))
	}
	if q.GetCustomerId() == "" {
		errs = append(errs, errors.New("customer_id is empty"))
	}
	if q.GetPriceVersion() <= 0 {
		errs = append(errs, errors.New("price_version is not positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, retry.Permanent(fmt.Errorf("submit quote %q: %w", q.GetQuoteId(), err))
	}
	return &quotev1.QuoteApprovalData{QuoteId: q.GetQuoteId(), CustomerId: q.GetCustomerId(), PriceVersion: q.GetPriceVersion()}, nil
}

// BuildPriceQuote asks pricing to price the quote at its price version.
func (Decider) BuildPriceQuote(_ context.Context, d *quotev1.QuoteApprovalData) (*pricingv1.PriceQuote, error) {
	return &pricingv1.PriceQuote{QuoteId: d.GetQuoteId(), PriceVersion: d.GetPriceVersion()}, nil
}

// BuildReleasePrice asks pricing to release the quote's held price.
func (Decider) BuildReleasePrice(_ context.Context, d *quotev1.QuoteApprovalData) (*pricingv1.ReleasePrice, error) {
	return &pricingv1.ReleasePrice{QuoteId: d.GetQuoteId()}, nil
}

// BuildSubmitOrder passes the held price by value, so ordering never reads
// pricing's tables.
func (Decider) BuildSubmitOrder(_ context.Context, d *quotev1.QuoteApprovalData) (*quotev1.SubmitOrder, error) {
	return &quotev1.SubmitOrder{
		QuoteId:         d.GetQuoteId(),
		CustomerId:      d.GetCustomerId(),
		PriceMinorUnits: d.GetPriceMinorUnits(),
		Currency:        d.GetCurrency(),
	}, nil
}

// OnQuotePriced keeps the held price.
func (Decider) OnQuotePriced(_ context.Context, d *quotev1.QuoteApprovalData, m *pricingv1.QuotePriced) error {
	d.PriceMinorUnits, d.Currency = m.GetPriceMinorUnits(), m.GetCurrency()
	return nil
}

// OnQuotePricingFailed keeps why the quote could not be priced.
func (Decider) OnQuotePricingFailed(_ context.Context, d *quotev1.QuoteApprovalData, m *pricingv1.QuotePricingFailed) error {
	d.RejectionReason = "pricing: " + m.GetReason()
	return nil
}

// OnApprovalGranted keeps who approved.
func (Decider) OnApprovalGranted(_ context.Context, d *quotev1.QuoteApprovalData, m *approvalv1.ApprovalGranted) error {
	d.ApproverEmail = m.GetApproverEmail()
	return nil
}

// OnApprovalRejected keeps who rejected the quote and why.
func (Decider) OnApprovalRejected(_ context.Context, d *quotev1.QuoteApprovalData, m *approvalv1.ApprovalRejected) error {
	d.ApproverEmail, d.RejectionReason = m.GetApproverEmail(), m.GetReason()
	return nil
}

// OnCancelQuote keeps who withdrew the quote (the audit trail has why).
func (Decider) OnCancelQuote(_ context.Context, d *quotev1.QuoteApprovalData, m *quotev1.CancelQuote) error {
	d.CancelledBy = m.GetRequestedBy()
	return nil
}

// OnOrderSubmitted keeps the order id.
func (Decider) OnOrderSubmitted(_ context.Context, d *quotev1.QuoteApprovalData, m *quotev1.OrderSubmitted) error {
	d.OrderId = m.GetOrderId()
	return nil
}
