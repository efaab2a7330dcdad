package sagadef_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/sagatest"
)

// Test contract: message full names.
const (
	pPlaceOrder             = "shop.v1.PlaceOrder"
	pReserveInventory       = "shop.v1.ReserveInventory"
	pInventoryReserved      = "shop.v1.InventoryReserved"
	pInventoryFailed        = "shop.v1.InventoryFailed"
	pReleaseInventory       = "shop.v1.ReleaseInventory"
	pInventoryReleased      = "shop.v1.InventoryReleased"
	pInventoryReleaseFailed = "shop.v1.InventoryReleaseFailed"
	pAuthorizePayment       = "shop.v1.AuthorizePayment"
	pPaymentAuthorized      = "shop.v1.PaymentAuthorized"
	pPaymentDeclined        = "shop.v1.PaymentDeclined"
	pScheduleShipping       = "shop.v1.ScheduleShipping"
	pShippingScheduled      = "shop.v1.ShippingScheduled"
	pShippingRejected       = "shop.v1.ShippingRejected"
	pApproveOrder           = "shop.v1.ApproveOrder"
	pOrderApproved          = "shop.v1.OrderApproved"
	pCancelOrder            = "shop.v1.CancelOrder"
	pValidateOrder          = "shop.v1.ValidateOrder"
	pOrderValid             = "shop.v1.OrderValid"
	pOrderInvalid           = "shop.v1.OrderInvalid"
	pFraudCleared           = "shop.v1.FraudCleared"
	pFraudFlagged           = "shop.v1.FraudFlagged"

	qRequestQuote   = "sales.v1.RequestQuote"
	qPrepareQuote   = "sales.v1.PrepareQuote"
	qQuotePrepared  = "sales.v1.QuotePrepared"
	qQuoteFailed    = "sales.v1.QuoteFailed"
	qWithdrawQuote  = "sales.v1.WithdrawQuote"
	qQuoteWithdrawn = "sales.v1.QuoteWithdrawn"
	qQuoteApproved  = "sales.v1.QuoteApproved"
	qQuoteRejected  = "sales.v1.QuoteRejected"
	qSendContract   = "sales.v1.SendContract"
	qContractSent   = "sales.v1.ContractSent"
	qQuoteCancelled = "sales.v1.QuoteCancelled"

	unknownMessage = "other.v1.Unrelated"
)

var types = func() map[string]*message.Info {
	out := map[string]*message.Info{}
	for _, n := range []string{pPlaceOrder, qRequestQuote, pCancelOrder} {
		out[n] = sagatest.NewType(n, message.KindCommand)
	}
	for _, n := range []string{pReserveInventory, pReleaseInventory, pAuthorizePayment, pScheduleShipping, pApproveOrder,
		pValidateOrder, qPrepareQuote, qWithdrawQuote, qSendContract} {
		out[n] = sagatest.NewType(n, message.KindCommand)
	}
	for _, n := range []string{pInventoryReserved, pInventoryFailed, pInventoryReleased, pInventoryReleaseFailed,
		pPaymentAuthorized, pPaymentDeclined, pShippingScheduled, pShippingRejected, pOrderApproved,
		pOrderValid, pOrderInvalid, qQuotePrepared, qQuoteFailed, qQuoteWithdrawn, qContractSent, unknownMessage} {
		out[n] = sagatest.NewType(n, message.KindReply)
	}
	for _, n := range []string{qQuoteApproved, qQuoteRejected, qQuoteCancelled, pFraudCleared, pFraudFlagged} {
		out[n] = sagatest.NewType(n, message.KindEvent)
	}
	return out
}()

// msg returns a test message of the given type for business key "order-1".
func msg(name string) message.Message {
	return sagatest.NewMessage(types[name], "order-1")
}

func hooks() sagadef.Hooks {
	all := make([]*message.Info, 0, len(types))
	for _, t := range types {
		all = append(all, t)
	}
	return sagatest.Hooks(all...)
}

// placeOrder returns an uncompiled Place Order definition: reserve inventory
// (compensatable), authorize payment (pivot), schedule shipping and approve
// order (retriable). mods adjust it before the caller compiles.
func placeOrder(mods ...func(*sagadef.Definition)) *sagadef.Definition {
	d := &sagadef.Definition{
		Name:         "shop.v1.PlaceOrderSaga",
		Table:        "saga_place_order",
		StartMessage: pPlaceOrder,
		DataMessage:  "shop.v1.PlaceOrderData",
		Deadline:     time.Hour,
		Steps: []sagadef.Step{
			{
				Name: "ReserveInventory", Role: sagadef.RoleCompensatable,
				Command:                    pReserveInventory,
				SuccessReplies:             []string{pInventoryReserved},
				FailureReplies:             []string{pInventoryFailed},
				Compensation:               pReleaseInventory,
				CompensationReply:          pInventoryReleased,
				CompensationFailureReplies: []string{pInventoryReleaseFailed},
				Timeout:                    30 * time.Second,
				OnTimeout:                  sagadef.TimeoutCompensate,
				MaxAttempts:                3,
				Late:                       sagadef.LateIgnore,
			},
			{
				Name: "AuthorizePayment", Role: sagadef.RolePivot,
				Command:        pAuthorizePayment,
				SuccessReplies: []string{pPaymentAuthorized},
				FailureReplies: []string{pPaymentDeclined},
				Timeout:        30 * time.Second,
				OnTimeout:      sagadef.TimeoutCompensate,
				Late:           sagadef.LateManualReview,
			},
			{
				Name: "ScheduleShipping", Role: sagadef.RoleRetriable,
				Command:        pScheduleShipping,
				SuccessReplies: []string{pShippingScheduled},
				FailureReplies: []string{pShippingRejected},
				Timeout:        time.Minute,
				OnTimeout:      sagadef.TimeoutRetry,
				MaxAttempts:    3,
				Late:           sagadef.LateApplyIfWaiting,
			},
			{
				Name: "ApproveOrder", Role: sagadef.RoleRetriable,
				Command:        pApproveOrder,
				SuccessReplies: []string{pOrderApproved},
				Timeout:        time.Minute,
				OnTimeout:      sagadef.TimeoutManualReview,
				Late:           sagadef.LateIgnore,
			},
		},
	}
	for _, m := range mods {
		m(d)
	}
	return d
}

// quoteApproval returns an uncompiled quote approval definition whose pivot
// waits for a human decision (an External step).
func quoteApproval(mods ...func(*sagadef.Definition)) *sagadef.Definition {
	d := &sagadef.Definition{
		Name:         "sales.v1.QuoteApprovalSaga",
		Table:        "saga_quote_approval",
		StartMessage: qRequestQuote,
		Steps: []sagadef.Step{
			{
				Name: "PrepareQuote", Role: sagadef.RoleCompensatable,
				Command:           qPrepareQuote,
				SuccessReplies:    []string{qQuotePrepared},
				FailureReplies:    []string{qQuoteFailed},
				Compensation:      qWithdrawQuote,
				CompensationReply: qQuoteWithdrawn,
				Timeout:           time.Minute,
				OnTimeout:         sagadef.TimeoutRetry,
				MaxAttempts:       2,
				Late:              sagadef.LateApplyIfWaiting,
			},
			{
				Name: "AwaitApproval", Role: sagadef.RolePivot, External: true,
				SuccessReplies: []string{qQuoteApproved},
				FailureReplies: []string{qQuoteRejected},
				Timeout:        72 * time.Hour,
				OnTimeout:      sagadef.TimeoutCompensate,
				Late:           sagadef.LateManualReview,
			},
			{
				Name: "SendContract", Role: sagadef.RoleRetriable,
				Command:        qSendContract,
				SuccessReplies: []string{qContractSent},
				Timeout:        time.Minute,
				OnTimeout:      sagadef.TimeoutRetry,
				MaxAttempts:    5,
				Late:           sagadef.LateIgnore,
			},
		},
	}
	for _, m := range mods {
		m(d)
	}
	return d
}

// checked adds two check steps to Place Order: ValidateOrder (a command)
// before ReserveInventory, and AwaitFraudClearance (external: a fraud
// team's decision) between ReserveInventory and AuthorizePayment.
func checked(d *sagadef.Definition) {
	validate := sagadef.Step{
		Name: "ValidateOrder", Role: sagadef.RoleCheck,
		Command:        pValidateOrder,
		SuccessReplies: []string{pOrderValid},
		FailureReplies: []string{pOrderInvalid},
		Timeout:        10 * time.Second,
		OnTimeout:      sagadef.TimeoutRetry,
		MaxAttempts:    2,
		Late:           sagadef.LateApplyIfWaiting,
	}
	fraud := sagadef.Step{
		Name: "AwaitFraudClearance", Role: sagadef.RoleCheck, External: true,
		SuccessReplies: []string{pFraudCleared},
		FailureReplies: []string{pFraudFlagged},
		Timeout:        time.Hour,
		OnTimeout:      sagadef.TimeoutCompensate,
		Late:           sagadef.LateIgnore,
	}
	d.Deadline = 3 * time.Hour
	d.Steps = append([]sagadef.Step{validate, d.Steps[0], fraud}, d.Steps[1:]...)
}

// cancellable declares a business cancel: CancelOrder (a command) for Place
// Order, the QuoteCancelled event for Quote Approval. Test messages carry
// one string, "value", so it names both who and why.
func cancellable(d *sagadef.Definition) {
	d.Cancel = sagadef.Cancel{Message: pCancelOrder, RequestedBy: "value", Reason: "value"}
	if d.StartMessage == qRequestQuote {
		d.Cancel.Message = qQuoteCancelled
	}
}

// compiled compiles d, failing the test on error.
func compiled(t testing.TB, d *sagadef.Definition) *sagadef.Definition {
	t.Helper()
	require.NoError(t, d.Compile())
	return d
}

// late sets the late policy of the named step.
func late(step string, p sagadef.LatePolicy) func(*sagadef.Definition) {
	return func(d *sagadef.Definition) {
		for i := range d.Steps {
			if d.Steps[i].Name == step {
				d.Steps[i].Late = p
			}
		}
	}
}
