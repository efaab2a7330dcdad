// Package workload is the Place Order traffic both saga implementations of
// the benchmark run: the same requests, the same products and stock, so the
// participants do the same work on either side.
package workload

import (
	"fmt"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// Products is how many products the orders spread over: enough that two
// orders rarely lock the same stock row at once.
const Products = 1000

// Stock is every product's starting stock: no order ever runs out.
const Stock = 1_000_000

// Steps is how many steps one Place Order saga runs: reserve inventory,
// authorize payment, schedule shipping, approve order.
const Steps = 4

// Product is the id of product i (0 <= i < Products).
func Product(i int) string { return fmt.Sprintf("p-%04d", i) }

// Request is order i of a run: two lines, a valid card, a full address.
func Request(run string, i int) *orderv1.PlaceOrderRequest {
	return &orderv1.PlaceOrderRequest{
		OrderId:    fmt.Sprintf("%s-%06d", run, i),
		CustomerId: fmt.Sprintf("c-%d", i%97),
		Lines: []*commonv1.OrderLine{
			{ProductId: Product((i * 7) % Products), Quantity: 1},
			{ProductId: Product((i*13 + 500) % Products), Quantity: 2},
		},
		Amount:          &commonv1.Money{Currency: "EUR", MinorUnits: 4999},
		ShippingAddress: &commonv1.Address{Name: "A. Customer", Street: "1 Main St", City: "Lyon", PostalCode: "69001", Country: "FR"},
		CardToken:       "tok_visa",
	}
}
