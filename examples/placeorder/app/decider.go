package app

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/retry"
)

// Decider is the Place Order saga's business logic: the saga data a request
// starts with, each command built from that data, and what the replies add to
// it. Sequencing, timeouts, retries and compensation are the runtime's.
type Decider struct {
	orderv1.PlaceOrderNoopFolds
}

var _ orderv1.PlaceOrderDecider = Decider{}

// Start validates the request and copies it into the saga data. An invalid
// request is a permanent failure: Start returns it to the caller and no saga
// begins.
func (Decider) Start(_ context.Context, req *orderv1.PlaceOrderRequest) (*orderv1.PlaceOrderData, error) {
	var errs []error
	if req.GetOrderId() == "" {
		errs = append(errs, errors.New("order_id is empty"))
	}
	if len(req.GetLines()) == 0 {
		errs = append(errs, errors.New("order has no lines"))
	}
	if req.GetAmount().GetMinorUnits() <= 0 {
		errs = append(errs, errors.New("amount is not positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, retry.Permanent(fmt.Errorf("place order %q: %w", req.GetOrderId(), err))
	}
	return &orderv1.PlaceOrderData{
		OrderId:         req.GetOrderId(),
		CustomerId:      req.GetCustomerId(),
		Lines:           cloneLines(req.GetLines()),
		Amount:          proto.Clone(req.GetAmount()).(*commonv1.Money),
		ShippingAddress: proto.Clone(req.GetShippingAddress()).(*commonv1.Address),
		CardToken:       req.GetCardToken(),
		CallbackUrl:     req.GetCallbackUrl(),
	}, nil
}

func cloneLines(lines []*commonv1.OrderLine) []*commonv1.OrderLine {
	out := make([]*commonv1.OrderLine, len(lines))
	for i, l := range lines {
		out[i] = proto.Clone(l).(*commonv1.OrderLine)
	}
	return out
}

// BuildReserveInventory asks inventory to hold the order's lines.
func (Decider) BuildReserveInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReserveInventory, error) {
	return &inventoryv1.ReserveInventory{OrderId: d.GetOrderId(), Lines: cloneLines(d.GetLines())}, nil
}

// BuildReleaseInventory asks inventory to give the order's stock back.
func (Decider) BuildReleaseInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReleaseInventory, error) {
	return &inventoryv1.ReleaseInventory{OrderId: d.GetOrderId()}, nil
}

// BuildAuthorizePayment passes the amount and card by value, so payment never
// reads the order.
func (Decider) BuildAuthorizePayment(_ context.Context, d *orderv1.PlaceOrderData) (*paymentv1.AuthorizePayment, error) {
	return &paymentv1.AuthorizePayment{
		OrderId:    d.GetOrderId(),
		CustomerId: d.GetCustomerId(),
		Amount:     proto.Clone(d.GetAmount()).(*commonv1.Money),
		CardToken:  d.GetCardToken(),
	}, nil
}

// BuildScheduleShipping asks shipping to book the order's shipment.
func (Decider) BuildScheduleShipping(_ context.Context, d *orderv1.PlaceOrderData) (*shippingv1.ScheduleShipping, error) {
	return &shippingv1.ScheduleShipping{
		OrderId: d.GetOrderId(),
		Address: proto.Clone(d.GetShippingAddress()).(*commonv1.Address),
	}, nil
}

// BuildApproveOrder asks the order service to approve the order.
func (Decider) BuildApproveOrder(_ context.Context, d *orderv1.PlaceOrderData) (*orderv1.ApproveOrder, error) {
	return &orderv1.ApproveOrder{OrderId: d.GetOrderId()}, nil
}

// OnInventoryReservationFailed keeps why the order failed.
func (Decider) OnInventoryReservationFailed(_ context.Context, d *orderv1.PlaceOrderData, m *inventoryv1.InventoryReservationFailed) error {
	d.FailureReason = "inventory: " + m.GetReason()
	return nil
}

// OnPaymentAuthorized keeps the authorization id.
func (Decider) OnPaymentAuthorized(_ context.Context, d *orderv1.PlaceOrderData, m *paymentv1.PaymentAuthorized) error {
	d.AuthorizationId = m.GetAuthorizationId()
	return nil
}

// OnPaymentAuthorizationFailed keeps why the order failed.
func (Decider) OnPaymentAuthorizationFailed(_ context.Context, d *orderv1.PlaceOrderData, m *paymentv1.PaymentAuthorizationFailed) error {
	d.FailureReason = "payment: " + m.GetReason()
	return nil
}

// OnShippingScheduled keeps the tracking id.
func (Decider) OnShippingScheduled(_ context.Context, d *orderv1.PlaceOrderData, m *shippingv1.ShippingScheduled) error {
	d.TrackingId = m.GetTrackingId()
	return nil
}
