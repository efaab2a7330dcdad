package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
)

// DeclinedCard is the card token the example payment service declines, like
// a payment provider's test card.
const DeclinedCard = "tok_declined"

// journal records one business effect in shop_ledger, in the effect's
// transaction. Nothing reads it back while handling the command, so it is
// deferred: sent with the reply in one round trip.
func journal(ctx context.Context, tx pgx.Tx, orderID, service, effect, detail string) error {
	return participant.Defer(ctx, tx, fmt.Sprintf("%s: journal %s of order %s", service, effect, orderID),
		`INSERT INTO shop_ledger (order_id, service, effect, detail) VALUES ($1, $2, $3, $4)`,
		orderID, service, effect, detail)
}

// Inventory is the inventory service: it holds stock for orders and gives it
// back when a later step fails.
type Inventory struct{}

var _ inventoryv1.InventoryParticipant = Inventory{}

// ReserveInventory holds every line of the order, or nothing: a line that
// cannot be held answers InventoryReservationFailed (a business failure) and
// holds no stock at all.
func (Inventory) ReserveInventory(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReserveInventory) (inventoryv1.ReserveInventoryResult, error) {
	orderID := cmd.GetOrderId()
	refuse := func(reason string) (inventoryv1.ReserveInventoryResult, error) {
		if err := journal(ctx, tx, orderID, "inventory", "reservation_refused", reason); err != nil {
			return nil, err
		}
		return &inventoryv1.InventoryReservationFailed{OrderId: orderID, Reason: reason}, nil
	}
	if err := lockStock(ctx, tx); err != nil {
		return nil, err
	}
	want := map[string]int64{} // summed wide: lines of one product could overflow int32
	for _, l := range cmd.GetLines() {
		if l.GetQuantity() <= 0 || l.GetProductId() == "" {
			return refuse(fmt.Sprintf("invalid line %q x %d", l.GetProductId(), l.GetQuantity()))
		}
		want[l.GetProductId()] += int64(l.GetQuantity())
		if want[l.GetProductId()] > math.MaxInt32 {
			return refuse(fmt.Sprintf("quantity of %q over %d", l.GetProductId(), math.MaxInt32))
		}
	}
	if len(want) == 0 {
		return refuse("order has no lines")
	}
	products := make([]string, 0, len(want))
	for p := range want {
		products = append(products, p)
	}
	slices.Sort(products) // lock rows in one order: no deadlocks between orders
	quantities := make([]int32, len(products))
	for i, p := range products {
		quantities[i] = int32(want[p]) // at most MaxInt32, checked above
	}
	rows, err := tx.Query(ctx, `SELECT product_id, available FROM inventory_stock
WHERE product_id = ANY($1) ORDER BY product_id FOR UPDATE`, products)
	if err != nil {
		return nil, fmt.Errorf("inventory: lock stock for order %s: %w", orderID, err)
	}
	available := map[string]int32{}
	for rows.Next() {
		var p string
		var n int32
		if err := rows.Scan(&p, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inventory: read stock for order %s: %w", orderID, err)
		}
		available[p] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inventory: read stock for order %s: %w", orderID, err)
	}
	var short []string
	for i, p := range products {
		if available[p] < quantities[i] {
			short = append(short, fmt.Sprintf("%s (want %d, have %d)", p, quantities[i], available[p]))
		}
	}
	if len(short) > 0 {
		return refuse("out of stock: " + strings.Join(short, ", "))
	}
	// The rows are locked and checked: the writes need no answer.
	if err := participant.Defer(ctx, tx, "inventory: take stock for order "+orderID, `UPDATE inventory_stock s SET available = s.available - x.q
FROM unnest($1::text[], $2::int[]) AS x(p, q) WHERE s.product_id = x.p`, products, quantities); err != nil {
		return nil, err
	}
	if err := participant.Defer(ctx, tx, "inventory: record reservation of order "+orderID, `INSERT INTO inventory_reservations (order_id, product_id, quantity)
SELECT $1, p, q FROM unnest($2::text[], $3::int[]) AS x(p, q)`, orderID, products, quantities); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, orderID, "inventory", "reserved", describe(products, quantities)); err != nil {
		return nil, err
	}
	return &inventoryv1.InventoryReserved{OrderId: orderID}, nil
}

// lockStock serializes the inventory service's effects across processes.
// Each effect locks its products' stock rows in product order, but a
// consumer batch applies several effects in one transaction, so two
// processes' batches would take the hot stock rows in opposite orders and
// deadlock (each costing PostgreSQL's deadlock timeout). One transaction-level
// advisory lock, taken before the first stock row, orders whole batches
// instead: one batch at a time, however many inventory processes run.
func lockStock(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, lockStockSQL); err != nil {
		return fmt.Errorf("inventory: lock stock: %w", err)
	}
	return nil
}

const lockStockSQL = `SELECT pg_advisory_xact_lock(hashtext('placeorder.inventory_stock'))`

// ReleaseInventory gives back whatever the order holds. Releasing an order
// that holds nothing succeeds: a release the saga sends because the
// reservation timed out may arrive before the reservation itself, and the
// runtime then drops the reservation when it comes (its compensation ran).
func (Inventory) ReleaseInventory(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReleaseInventory) (inventoryv1.ReleaseInventoryResult, error) {
	orderID := cmd.GetOrderId()
	if err := lockStock(ctx, tx); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `UPDATE inventory_reservations SET released_at = now()
WHERE order_id = $1 AND released_at IS NULL RETURNING product_id, quantity`, orderID)
	if err != nil {
		return nil, fmt.Errorf("inventory: release order %s: %w", orderID, err)
	}
	var products []string
	var quantities []int32
	for rows.Next() {
		var p string
		var q int32
		if err := rows.Scan(&p, &q); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inventory: read release of order %s: %w", orderID, err)
		}
		products, quantities = append(products, p), append(quantities, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inventory: release order %s: %w", orderID, err)
	}
	if len(products) == 0 {
		if err := journal(ctx, tx, orderID, "inventory", "released_nothing", ""); err != nil {
			return nil, err
		}
		return &inventoryv1.InventoryReleased{OrderId: orderID}, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE inventory_stock s SET available = s.available + x.q
FROM unnest($1::text[], $2::int[]) AS x(p, q) WHERE s.product_id = x.p`, products, quantities); err != nil {
		return nil, fmt.Errorf("inventory: return stock of order %s: %w", orderID, err)
	}
	if err := journal(ctx, tx, orderID, "inventory", "released", describe(products, quantities)); err != nil {
		return nil, err
	}
	return &inventoryv1.InventoryReleased{OrderId: orderID}, nil
}

func describe(products []string, quantities []int32) string {
	parts := make([]string, len(products))
	for i := range products {
		parts[i] = fmt.Sprintf("%s x %d", products[i], quantities[i])
	}
	return strings.Join(parts, ", ")
}

// Payment is the payment service: it authorizes the order's amount. It is the
// saga's pivot: an authorization is never undone by the saga.
type Payment struct{}

var _ paymentv1.PaymentParticipant = Payment{}

// AuthorizePayment authorizes the amount, or declines it (a business failure)
// for DeclinedCard and for amounts that are not positive.
func (Payment) AuthorizePayment(ctx context.Context, tx pgx.Tx, cmd *paymentv1.AuthorizePayment) (paymentv1.AuthorizePaymentResult, error) {
	orderID, amount := cmd.GetOrderId(), cmd.GetAmount()
	decline := func(reason string) (paymentv1.AuthorizePaymentResult, error) {
		if err := journal(ctx, tx, orderID, "payment", "declined", reason); err != nil {
			return nil, err
		}
		return &paymentv1.PaymentAuthorizationFailed{OrderId: orderID, Reason: reason}, nil
	}
	switch {
	case cmd.GetCardToken() == DeclinedCard:
		return decline("card declined")
	case amount.GetMinorUnits() <= 0 || amount.GetCurrency() == "":
		return decline(fmt.Sprintf("invalid amount %d %q", amount.GetMinorUnits(), amount.GetCurrency()))
	}
	authID := "auth_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, "payment: authorize order "+orderID, `INSERT INTO payment_authorizations (order_id, authorization_id, currency, minor_units)
VALUES ($1, $2, $3, $4)`, orderID, authID, amount.GetCurrency(), amount.GetMinorUnits()); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, orderID, "payment", "authorized",
		fmt.Sprintf("%d %s", amount.GetMinorUnits(), amount.GetCurrency())); err != nil {
		return nil, err
	}
	return &paymentv1.PaymentAuthorized{OrderId: orderID, AuthorizationId: authID}, nil
}

// Shipping is the shipping service: it books a shipment. Its step comes after
// the pivot, so it never answers with a business failure: it either books or
// returns an error, and the message is retried.
type Shipping struct {
	// Manifests, with Locks, are the carriers' pickup manifests: each
	// booking is added to its carrier's under the carrier's fenced lease
	// (see CarrierManifests). Without them, bookings stay in the shop's
	// database only.
	Manifests *CarrierManifests
	// Locks hands out the carriers' leases.
	Locks *lock.Locker
}

var _ shippingv1.ShippingParticipant = Shipping{}

// ScheduleShipping books the shipment of an order, and puts it on its
// carrier's pickup manifest.
func (s Shipping) ScheduleShipping(ctx context.Context, tx pgx.Tx, cmd *shippingv1.ScheduleShipping) (shippingv1.ScheduleShippingResult, error) {
	orderID, country := cmd.GetOrderId(), cmd.GetAddress().GetCountry()
	if country == "" {
		// After the pivot there is no business failure to answer
		// with: this is a bad command, parked for an operator.
		return nil, retry.Permanent(errors.New("shipping: address without country for order " + orderID))
	}
	var carrier string
	err := tx.QueryRow(ctx, `SELECT carrier FROM shipping_carriers WHERE country = $1`, country).Scan(&carrier)
	if errors.Is(err, pgx.ErrNoRows) {
		// Retrying cannot help: park the command until an operator
		// adds a carrier for the country and replays it.
		return nil, retry.Permanent(fmt.Errorf("shipping: no carrier serves country %q (order %s); add one to shipping_carriers, then replay this message", country, orderID))
	}
	if err != nil {
		return nil, fmt.Errorf("shipping: find a carrier for %s (order %s): %w", country, orderID, err)
	}
	if s.Manifests != nil {
		if err := addToManifest(ctx, s.Locks, s.Manifests, carrier, orderID); err != nil {
			return nil, err
		}
	}
	tracking := "trk_" + uuid.NewString()
	if err := participant.Defer(ctx, tx, "shipping: book order "+orderID,
		`INSERT INTO shipping_shipments (order_id, tracking_id) VALUES ($1, $2)`, orderID, tracking); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, orderID, "shipping", "booked", cmd.GetAddress().GetCountry()); err != nil {
		return nil, err
	}
	return &shippingv1.ShippingScheduled{OrderId: orderID, TrackingId: tracking}, nil
}

// Approval is the order service's own step: it marks the order approved.
type Approval struct{}

var _ orderv1.OrderParticipant = Approval{}

// ApproveOrder approves the order.
func (Approval) ApproveOrder(ctx context.Context, tx pgx.Tx, cmd *orderv1.ApproveOrder) (orderv1.ApproveOrderResult, error) {
	orderID := cmd.GetOrderId()
	if err := participant.Defer(ctx, tx, "order: approve order "+orderID,
		`INSERT INTO order_approvals (order_id) VALUES ($1)`, orderID); err != nil {
		return nil, err
	}
	if err := journal(ctx, tx, orderID, "order", "approved", ""); err != nil {
		return nil, err
	}
	return &orderv1.OrderApproved{OrderId: orderID}, nil
}
