package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	paymentv1 "github.com/protosaga/saga/examples/travel/payment/v1"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// DeclinedCard is the card token the example card service declines, like a
// payment provider's test card.
const DeclinedCard = "tok_declined"

// FlaggedCard is the card token the example fraud service flags: the card
// is authorized, then the screening refuses the payment.
const FlaggedCard = "tok_flagged"

// PaymentDecider is the Payment saga's business logic: the payments
// service runs it as the child of a Book Trip, from the ChargeTrip its
// parent sends. Its data's reason and charge_id are copied into the replies
// that answer the parent.
type PaymentDecider struct {
	paymentv1.PaymentNoopFolds
}

var _ paymentv1.PaymentDecider = PaymentDecider{}

// Start validates the charge. An invalid one is a permanent failure.
func (PaymentDecider) Start(_ context.Context, c *paymentv1.ChargeTrip) (*paymentv1.PaymentData, error) {
	if c.GetTripId() == "" || c.GetCurrency() == "" || c.GetAmountMinorUnits() <= 0 {
		return nil, retry.Permanent(fmt.Errorf("charge trip %q: want a trip, a currency and a positive amount (got %d %q)",
			c.GetTripId(), c.GetAmountMinorUnits(), c.GetCurrency()))
	}
	return &paymentv1.PaymentData{
		TripId: c.GetTripId(), CardToken: c.GetCardToken(), AmountMinorUnits: c.GetAmountMinorUnits(), Currency: c.GetCurrency(),
	}, nil
}

// BuildAuthorizeCard holds the amount on the card.
func (PaymentDecider) BuildAuthorizeCard(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.AuthorizeCard, error) {
	return &paymentv1.AuthorizeCard{
		TripId: d.GetTripId(), CardToken: d.GetCardToken(), AmountMinorUnits: d.GetAmountMinorUnits(), Currency: d.GetCurrency(),
	}, nil
}

// BuildVoidAuthorization releases the held amount.
func (PaymentDecider) BuildVoidAuthorization(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.VoidAuthorization, error) {
	return &paymentv1.VoidAuthorization{TripId: d.GetTripId()}, nil
}

// BuildScreenPayment asks the fraud service about the payment.
func (PaymentDecider) BuildScreenPayment(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.ScreenPayment, error) {
	return &paymentv1.ScreenPayment{TripId: d.GetTripId(), CardToken: d.GetCardToken(), AmountMinorUnits: d.GetAmountMinorUnits()}, nil
}

// BuildCaptureFunds takes the authorized amount.
func (PaymentDecider) BuildCaptureFunds(_ context.Context, d *paymentv1.PaymentData) (*paymentv1.CaptureFunds, error) {
	return &paymentv1.CaptureFunds{TripId: d.GetTripId(), AuthorizationId: d.GetAuthorizationId()}, nil
}

// OnCardAuthorized keeps the authorization.
func (PaymentDecider) OnCardAuthorized(_ context.Context, d *paymentv1.PaymentData, m *paymentv1.CardAuthorized) error {
	d.AuthorizationId = m.GetAuthorizationId()
	return nil
}

// OnCardDeclined keeps why (it answers the parent in PaymentDeclined).
func (PaymentDecider) OnCardDeclined(_ context.Context, d *paymentv1.PaymentData, m *paymentv1.CardDeclined) error {
	d.Reason = m.GetReason()
	return nil
}

// OnPaymentFlagged keeps why (it answers the parent in PaymentDeclined).
func (PaymentDecider) OnPaymentFlagged(_ context.Context, d *paymentv1.PaymentData, m *paymentv1.PaymentFlagged) error {
	d.Reason = m.GetReason()
	return nil
}

// OnFundsCaptured keeps the charge (it answers the parent in TripCharged).
func (PaymentDecider) OnFundsCaptured(_ context.Context, d *paymentv1.PaymentData, m *paymentv1.FundsCaptured) error {
	d.ChargeId = m.GetChargeId()
	return nil
}

// Cards is the card service: it authorizes, voids and captures.
type Cards struct{}

var _ paymentv1.CardsParticipant = Cards{}

// AuthorizeCard holds the amount, or declines DeclinedCard.
func (Cards) AuthorizeCard(ctx context.Context, tx pgx.Tx, cmd *paymentv1.AuthorizeCard) (paymentv1.AuthorizeCardResult, error) {
	tripID := cmd.GetTripId()
	if cmd.GetCardToken() == DeclinedCard {
		if err := journal(ctx, tx, tripID, "cards", "declined", "card declined"); err != nil {
			return nil, err
		}
		return &paymentv1.CardDeclined{TripId: tripID, Reason: "card declined"}, nil
	}
	auth := "auth_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, "cards: authorize trip "+tripID,
		`INSERT INTO card_authorizations (trip_id, authorization_id, currency, minor_units) VALUES ($1, $2, $3, $4)`,
		tripID, auth, cmd.GetCurrency(), cmd.GetAmountMinorUnits()); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, tripID, "cards", "authorized", fmt.Sprintf("%d %s", cmd.GetAmountMinorUnits(), cmd.GetCurrency())); err != nil {
		return nil, err
	}
	return &paymentv1.CardAuthorized{TripId: tripID, AuthorizationId: auth}, nil
}

// VoidAuthorization releases what the trip holds on the card; a trip
// holding nothing has nothing to void.
func (Cards) VoidAuthorization(ctx context.Context, tx pgx.Tx, cmd *paymentv1.VoidAuthorization) (paymentv1.VoidAuthorizationResult, error) {
	tripID := cmd.GetTripId()
	tag, err := tx.Exec(ctx, `UPDATE card_authorizations SET voided_at = now() WHERE trip_id = $1 AND voided_at IS NULL AND captured_at IS NULL`, tripID)
	if err != nil {
		return nil, fmt.Errorf("cards: void the authorization of trip %s: %w", tripID, err)
	}
	effect := "voided"
	if tag.RowsAffected() == 0 {
		effect = "voided_nothing"
	}
	if err := journal(ctx, tx, tripID, "cards", effect, ""); err != nil {
		return nil, err
	}
	return &paymentv1.AuthorizationVoided{TripId: tripID}, nil
}

// CaptureFunds charges the authorized amount. After the payment's pivot
// there is no business failure: an authorization that is missing is a bad
// command, parked for an operator.
func (Cards) CaptureFunds(ctx context.Context, tx pgx.Tx, cmd *paymentv1.CaptureFunds) (paymentv1.CaptureFundsResult, error) {
	tripID := cmd.GetTripId()
	charge := "ch_" + uuid.NewString()
	tag, err := tx.Exec(ctx, `UPDATE card_authorizations SET captured_at = now(), charge_id = $2
WHERE trip_id = $1 AND voided_at IS NULL AND captured_at IS NULL`, tripID, charge)
	if err != nil {
		return nil, fmt.Errorf("cards: capture trip %s: %w", tripID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil, retry.Permanent(errors.New("cards: no open authorization to capture for trip " + tripID))
	}
	if err := journal(ctx, tx, tripID, "cards", "captured", charge); err != nil {
		return nil, err
	}
	return &paymentv1.FundsCaptured{TripId: tripID, ChargeId: charge}, nil
}

// Fraud is the fraud service: it screens payments. A check step: nothing
// to undo.
type Fraud struct{}

var _ paymentv1.FraudParticipant = Fraud{}

// ScreenPayment flags FlaggedCard and clears the rest.
func (Fraud) ScreenPayment(ctx context.Context, tx pgx.Tx, cmd *paymentv1.ScreenPayment) (paymentv1.ScreenPaymentResult, error) {
	tripID := cmd.GetTripId()
	if cmd.GetCardToken() == FlaggedCard {
		if err := journal(ctx, tx, tripID, "fraud", "flagged", "card on the watch list"); err != nil {
			return nil, err
		}
		return &paymentv1.PaymentFlagged{TripId: tripID, Reason: "flagged by fraud screening"}, nil
	}
	if err := journal(ctx, tx, tripID, "fraud", "cleared", ""); err != nil {
		return nil, err
	}
	return &paymentv1.PaymentCleared{TripId: tripID}, nil
}
