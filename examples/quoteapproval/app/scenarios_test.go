package app_test

import (
	"testing"

	"github.com/protosaga/saga/examples/quoteapproval/app"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/examples/quoteapproval/quote/v1/quotev1test"
)

// TestQuoteApprovalScenarios runs the generated scenarios of Quote Approval
// with this example's decider.
func TestQuoteApprovalScenarios(t *testing.T) {
	quotev1test.RunQuoteApprovalScenarios(t, app.Decider{}, &quotev1.SubmitQuote{
		QuoteId: "q-scenario", CustomerId: "c-1", CustomerEmail: "c-1@customer.example", PriceVersion: 1,
	})
}
