package app_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// TestReserveRefusesQuantitiesPastInt32: an order whose lines for one
// product add up past int32 is refused; before, the sum wrapped, so such an
// order held 1 widget, or created stock out of nothing.
func TestReserveRefusesQuantitiesPastInt32(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// 2*(2^31-1) + 3 = 2^32 + 1 units of widget: wraps to 1.
	huge := request("o-overflow-wrap")
	huge.Lines = []*commonv1.OrderLine{
		{ProductId: "widget", Quantity: math.MaxInt32},
		{ProductId: "widget", Quantity: math.MaxInt32},
		{ProductId: "widget", Quantity: 3},
	}
	// (2^31-1) + 2 units of a sold-out product: wraps negative.
	neg := request("o-overflow-neg")
	neg.Lines = []*commonv1.OrderLine{
		{ProductId: "sold-out", Quantity: math.MaxInt32},
		{ProductId: "sold-out", Quantity: 2},
	}
	id1 := b.start(t, huge)
	id2 := b.start(t, neg)
	st1 := b.wait(t, id1, "terminal", func(s *orderv1.PlaceOrderSnapshot) bool { return s.Terminal() })
	st2 := b.wait(t, id2, "terminal", func(s *orderv1.PlaceOrderSnapshot) bool { return s.Terminal() })
	var widget, soldOut int32
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT available FROM inventory_stock WHERE product_id='widget'`).Scan(&widget))
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT available FROM inventory_stock WHERE product_id='sold-out'`).Scan(&soldOut))
	var reservations int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM inventory_reservations WHERE order_id LIKE 'o-overflow-%'`).Scan(&reservations))
	require.Zero(t, reservations)
	require.Equal(t, orderv1.PlaceOrderStateFailed, st1.State, "an order for 4294967297 widgets must not be reserved")
	require.Equal(t, orderv1.PlaceOrderStateFailed, st2.State, "an order for 2147483649 sold-out units must not be reserved")
	require.EqualValues(t, 1000, widget)
	require.EqualValues(t, 0, soldOut)
}
