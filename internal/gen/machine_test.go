package gen_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/examples/placeorder/shop/order/v1/orderv1test"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	approvalv1 "github.com/protosaga/saga/examples/quoteapproval/approval/v1"
	pricingv1 "github.com/protosaga/saga/examples/quoteapproval/pricing/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/examples/quoteapproval/quote/v1/quotev1test"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// placeOrder is a PlaceOrderDecider that builds commands from saga data and
// folds the payment authorization into it.
type placeOrder struct {
	orderv1.PlaceOrderNoopFolds
}

func (placeOrder) Start(_ context.Context, m *orderv1.PlaceOrderRequest) (*orderv1.PlaceOrderData, error) {
	return &orderv1.PlaceOrderData{OrderId: m.GetOrderId(), CustomerId: m.GetCustomerId(), Lines: m.GetLines(),
		Amount: m.GetAmount(), ShippingAddress: m.GetShippingAddress(), CardToken: m.GetCardToken()}, nil
}
func (placeOrder) BuildReserveInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReserveInventory, error) {
	return &inventoryv1.ReserveInventory{OrderId: d.GetOrderId(), Lines: d.GetLines()}, nil
}
func (placeOrder) BuildReleaseInventory(_ context.Context, d *orderv1.PlaceOrderData) (*inventoryv1.ReleaseInventory, error) {
	return &inventoryv1.ReleaseInventory{OrderId: d.GetOrderId()}, nil
}
func (placeOrder) BuildAuthorizePayment(_ context.Context, d *orderv1.PlaceOrderData) (*paymentv1.AuthorizePayment, error) {
	return &paymentv1.AuthorizePayment{OrderId: d.GetOrderId(), CustomerId: d.GetCustomerId(), Amount: d.GetAmount(), CardToken: d.GetCardToken()}, nil
}
func (placeOrder) BuildScheduleShipping(_ context.Context, d *orderv1.PlaceOrderData) (*shippingv1.ScheduleShipping, error) {
	return &shippingv1.ScheduleShipping{OrderId: d.GetOrderId(), Address: d.GetShippingAddress()}, nil
}
func (placeOrder) BuildApproveOrder(_ context.Context, d *orderv1.PlaceOrderData) (*orderv1.ApproveOrder, error) {
	return &orderv1.ApproveOrder{OrderId: d.GetOrderId()}, nil
}
func (placeOrder) OnPaymentAuthorized(_ context.Context, d *orderv1.PlaceOrderData, m *paymentv1.PaymentAuthorized) error {
	d.AuthorizationId = m.GetAuthorizationId()
	return nil
}

func placeOrderRequest() *orderv1.PlaceOrderRequest {
	return &orderv1.PlaceOrderRequest{
		OrderId: "o-1", CustomerId: "c-1", CardToken: "tok",
		Lines:  []*commonv1.OrderLine{{ProductId: "p-1", Quantity: 2}},
		Amount: &commonv1.Money{Currency: "EUR", MinorUnits: 1999},
	}
}

// TestPlaceOrderHappyPath runs the generated definition, hooks and typed
// harness through every step.
func TestPlaceOrderHappyPath(t *testing.T) {
	t.Parallel()
	h := orderv1test.NewPlaceOrder(t, placeOrder{})
	h.Begin(placeOrderRequest())
	h.RequireState(orderv1.PlaceOrderStateReserveInventory)
	h.RequireSent(inventoryv1.ReserveInventoryInfo.FullName)
	reserve := h.SentReserveInventory()
	require.Equal(t, "o-1", reserve.IdempotencyKey())
	require.Len(t, reserve.GetLines(), 1)

	h.Reply(&inventoryv1.InventoryReserved{OrderId: "o-1"})
	h.RequireState(orderv1.PlaceOrderStateAuthorizePayment)
	require.Equal(t, "tok", h.SentAuthorizePayment().GetCardToken())

	h.Reply(&paymentv1.PaymentAuthorized{OrderId: "o-1", AuthorizationId: "auth-9"})
	h.RequireState(orderv1.PlaceOrderStateScheduleShipping)
	require.Equal(t, "auth-9", h.Data().GetAuthorizationId(), "the OnPaymentAuthorized fold ran")

	h.Duplicate()
	h.RequireClass(sagadef.ClassDuplicate)
	h.RequireSent()

	h.Reply(&shippingv1.ShippingScheduled{OrderId: "o-1"})
	h.RequireState(orderv1.PlaceOrderStateApproveOrder)
	h.Reply(&orderv1.OrderApproved{OrderId: "o-1"})
	h.RequireState(orderv1.PlaceOrderStateCompleted)
}

// TestPlaceOrderPaymentFailureCompensates: a declined payment releases the
// reserved inventory, then the saga fails.
func TestPlaceOrderPaymentFailureCompensates(t *testing.T) {
	t.Parallel()
	h := orderv1test.NewPlaceOrder(t, placeOrder{})
	h.Begin(placeOrderRequest())
	h.Reply(&inventoryv1.InventoryReserved{OrderId: "o-1"})
	h.Reply(&paymentv1.PaymentAuthorizationFailed{OrderId: "o-1", Reason: "declined"})
	h.RequireState(orderv1.PlaceOrderStateCompensatingReserveInventory)
	h.RequireSent(inventoryv1.ReleaseInventoryInfo.FullName)
	require.Equal(t, "o-1", h.SentReleaseInventory().IdempotencyKey())
	h.Reply(&inventoryv1.InventoryReleased{OrderId: "o-1"})
	h.RequireState(orderv1.PlaceOrderStateFailed)
}

// buildFails returns an error from one builder: the hooks adapter must pass
// it through, not send a nil command.
type buildFails struct{ placeOrder }

func (buildFails) BuildAuthorizePayment(context.Context, *orderv1.PlaceOrderData) (*paymentv1.AuthorizePayment, error) {
	return nil, nil
}

func TestPlaceOrderBuilderReturningNilIsAnError(t *testing.T) {
	t.Parallel()
	h := orderv1test.NewPlaceOrder(t, buildFails{})
	h.Begin(placeOrderRequest())
	_, err := h.TryApply(sagadef.Trigger{
		Kind: inventoryv1.InventoryReservedInfo.FullName, Message: &inventoryv1.InventoryReserved{OrderId: "o-1"},
		MessageID: "r-1", CausationID: h.Instance().PendingMessageID,
	})
	require.ErrorContains(t, err, "BuildAuthorizePayment returned no command")
}

type quoteApproval struct {
	quotev1.QuoteApprovalNoopFolds
}

func (quoteApproval) Start(_ context.Context, m *quotev1.SubmitQuote) (*quotev1.QuoteApprovalData, error) {
	return &quotev1.QuoteApprovalData{QuoteId: m.GetQuoteId(), CustomerId: m.GetCustomerId(), PriceVersion: m.GetPriceVersion()}, nil
}
func (quoteApproval) BuildPriceQuote(_ context.Context, d *quotev1.QuoteApprovalData) (*pricingv1.PriceQuote, error) {
	return &pricingv1.PriceQuote{QuoteId: d.GetQuoteId(), PriceVersion: d.GetPriceVersion()}, nil
}
func (quoteApproval) BuildReleasePrice(_ context.Context, d *quotev1.QuoteApprovalData) (*pricingv1.ReleasePrice, error) {
	return &pricingv1.ReleasePrice{QuoteId: d.GetQuoteId()}, nil
}
func (quoteApproval) OnCancelQuote(_ context.Context, d *quotev1.QuoteApprovalData, m *quotev1.CancelQuote) error {
	d.CancelledBy = m.GetRequestedBy()
	return nil
}
func (quoteApproval) BuildSubmitOrder(_ context.Context, d *quotev1.QuoteApprovalData) (*quotev1.SubmitOrder, error) {
	return &quotev1.SubmitOrder{QuoteId: d.GetQuoteId()}, nil
}

// TestQuoteApprovalLateApproval: the approval wait times out (the held price
// is released) and an approval arriving afterwards is late; its policy
// sends the quote to manual review instead of dropping a human decision.
func TestQuoteApprovalLateApproval(t *testing.T) {
	t.Parallel()
	h := quotev1test.NewQuoteApproval(t, quoteApproval{})
	h.Begin(&quotev1.SubmitQuote{QuoteId: "q-1", PriceVersion: 7})
	require.Equal(t, "q-1/7", h.SentPriceQuote().IdempotencyKey(), "composite key joins its parts")
	h.Reply(&pricingv1.QuotePriced{QuoteId: "q-1"})
	h.RequireState(quotev1.QuoteApprovalStateApproval)
	h.RequireSent()

	h.Timeout()
	h.RequireState(quotev1.QuoteApprovalStateCompensatingPriceQuote)
	h.RequireSent(pricingv1.ReleasePriceInfo.FullName)
	h.Reply(&pricingv1.PriceReleased{QuoteId: "q-1"})
	h.RequireState(quotev1.QuoteApprovalStateFailed)

	h.ReplyTo("", &approvalv1.ApprovalGranted{QuoteId: proto.String("q-1"), ApproverEmail: proto.String("a@example.com")})
	h.RequireClass(sagadef.ClassLate)
	h.RequireState(quotev1.QuoteApprovalStateManualReview)

	// The operator honours the late approval: the price is gone, so the
	// quote is re-issued by hand and this saga ends completed.
	h.Resolve(quotev1.QuoteApprovalStateCompleted, "re-quoted by hand (ticket Q-7)")
	h.RequireState(quotev1.QuoteApprovalStateCompleted)
	require.True(t, h.State().Terminal())
	last := h.History()[len(h.History())-1].Trigger
	require.Equal(t, "re-quoted by hand (ticket Q-7)", last.Reason)
}

// TestQuoteApprovalCancel: a withdrawal before the approval releases the
// held price and ends CANCELLED, naming who asked and why; after the
// approval it is refused and changes nothing.
func TestQuoteApprovalCancel(t *testing.T) {
	t.Parallel()
	h := quotev1test.NewQuoteApproval(t, quoteApproval{})
	h.Begin(&quotev1.SubmitQuote{QuoteId: "q-3", PriceVersion: 2})
	h.Reply(&pricingv1.QuotePriced{QuoteId: "q-3"})
	h.RequireState(quotev1.QuoteApprovalStateApproval)
	res := h.Cancel(&quotev1.CancelQuote{QuoteId: "q-3", RequestedBy: "customer:c-9", Reason: "bought elsewhere"})
	h.RequireState(quotev1.QuoteApprovalStateCompensatingPriceQuote)
	h.RequireSent(pricingv1.ReleasePriceInfo.FullName)
	require.Equal(t, &sagadef.Cancellation{RequestedBy: "customer:c-9", Reason: "bought elsewhere", MessageID: res.Instance.Progress.Cancel.MessageID},
		res.Instance.Progress.Cancel)
	require.Equal(t, "customer:c-9", h.Data().GetCancelledBy(), "the OnCancelQuote fold ran")
	h.Reply(&pricingv1.PriceReleased{QuoteId: "q-3"})
	h.RequireState(quotev1.QuoteApprovalStateCancelled)

	after := quotev1test.NewQuoteApproval(t, quoteApproval{})
	after.Begin(&quotev1.SubmitQuote{QuoteId: "q-4", PriceVersion: 1})
	after.Reply(&pricingv1.QuotePriced{QuoteId: "q-4"})
	after.ReplyTo("", &approvalv1.ApprovalGranted{QuoteId: proto.String("q-4")})
	after.RequireState(quotev1.QuoteApprovalStateSubmitOrder)
	res = after.Cancel(&quotev1.CancelQuote{QuoteId: "q-4", RequestedBy: "customer:c-9", Reason: "too late"})
	after.RequireClass(sagadef.ClassLate)
	after.RequireState(quotev1.QuoteApprovalStateSubmitOrder)
	after.RequireSent()
	require.Contains(t, res.Note, "refused: pivot step Approval completed")
	require.Empty(t, after.Data().GetCancelledBy(), "a refused cancel is not folded")
}

// TestQuoteApprovalOperatorActions: the harness's typed operator actions.
func TestQuoteApprovalOperatorActions(t *testing.T) {
	t.Parallel()
	h := quotev1test.NewQuoteApproval(t, quoteApproval{})
	h.Begin(&quotev1.SubmitQuote{QuoteId: "q-5", PriceVersion: 1})
	for range 3 { // max_attempts 3, then manual review
		h.Timeout()
	}
	h.RequireState(quotev1.QuoteApprovalStateManualReview)
	h.OperatorRetry("pricing is back")
	h.RequireState(quotev1.QuoteApprovalStatePriceQuote)
	h.RequireSent(pricingv1.PriceQuoteInfo.FullName)
	h.OperatorCompensate("customer gave up")
	h.RequireState(quotev1.QuoteApprovalStateCompensatingPriceQuote)
	h.OperatorCancel("nothing was held")
	h.RequireState(quotev1.QuoteApprovalStateCancelled)
}

// TestQuoteApprovalGranted: the external approval event advances the saga.
func TestQuoteApprovalGranted(t *testing.T) {
	t.Parallel()
	h := quotev1test.NewQuoteApproval(t, quoteApproval{})
	h.Begin(&quotev1.SubmitQuote{QuoteId: "q-2", PriceVersion: 1})
	h.Reply(&pricingv1.QuotePriced{QuoteId: "q-2"})
	h.ReplyTo("", &approvalv1.ApprovalGranted{QuoteId: proto.String("q-2")})
	h.RequireState(quotev1.QuoteApprovalStateSubmitOrder)
	h.RequireSent(quotev1.SubmitOrderInfo.FullName)
	h.Reply(&quotev1.OrderSubmitted{QuoteId: "q-2"})
	h.RequireState(quotev1.QuoteApprovalStateCompleted)
}

type inventory struct {
	reply inventoryv1.ReserveInventoryResult
}

func (i inventory) ReserveInventory(context.Context, pgx.Tx, *inventoryv1.ReserveInventory) (inventoryv1.ReserveInventoryResult, error) {
	return i.reply, nil
}
func (inventory) ReleaseInventory(context.Context, pgx.Tx, *inventoryv1.ReleaseInventory) (inventoryv1.ReleaseInventoryResult, error) {
	return nil, errors.New("unavailable")
}

// TestParticipantDispatch exercises the generated participant dispatch:
// by command type, errors passed through, a missing reply and an unknown
// command parked as permanent failures.
func TestParticipantDispatch(t *testing.T) {
	t.Parallel()
	handle := participant.Handler(inventoryv1.InventoryParticipantFunc(inventory{}))
	deliver := func(m message.Message) error {
		env := message.Envelope{MessageID: "m-1", MessageType: m.SagaMessageInfo().FullName}
		return handle(context.Background(), nil, &consumer.Delivery{Envelope: env, Message: m})
	}
	err := deliver(&inventoryv1.ReserveInventory{OrderId: "o-1"})
	require.Error(t, err)
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err), "a nil reply is a bug: parked, not retried")
	require.ErrorContains(t, err, "handle shop.inventory.v1.ReserveInventory m-1")
	require.ErrorContains(t, err, "returned neither a reply nor an error")

	err = deliver(&inventoryv1.ReleaseInventory{OrderId: "o-1"})
	require.ErrorContains(t, err, "unavailable")
	require.NotEqual(t, retry.ClassPermanent, retry.ClassOf(err))

	err = deliver(&paymentv1.AuthorizePayment{OrderId: "o-1"})
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))
	require.ErrorContains(t, err, "unexpected command shop.payment.v1.AuthorizePayment")
}
