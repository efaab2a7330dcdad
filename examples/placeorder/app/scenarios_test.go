package app_test

import (
	"testing"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/examples/placeorder/shop/order/v1/orderv1test"
)

// TestPlaceOrderScenarios runs the generated scenarios of Place Order with
// this example's decider: every command it builds and every reply it folds
// on each path the graph allows.
func TestPlaceOrderScenarios(t *testing.T) {
	orderv1test.RunPlaceOrderScenarios(t, app.Decider{}, request("o-scenario"))
}
