// Package shop is the business SQL of the Place Order participants, for the
// benchmark's peer builds of the saga (Temporal, DBOS): the same effects on the
// same tables (app.Migrations) as the runtime's example and the Watermill
// build — take stock and record the reservation, authorize the payment, book
// the shipment, approve the order, each journaled in shop_ledger — plus the
// compensations a failed later step runs (release the stock, void the
// payment, cancel the shipment).
//
// Every function runs its statements on a transaction the caller owns: a
// Temporal activity's own transaction, or the one DBOS opens for a step and
// commits with the step's checkpoint.
package shop

import (
	"context"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// Line is one order line.
type Line struct {
	ProductID string `json:"product_id"`
	Quantity  int32  `json:"quantity"`
}

// Order is what a saga carries from step to step: the request in plain,
// JSON-serializable fields (both peers serialize workflow inputs as JSON).
type Order struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Lines      []Line `json:"lines"`
	Currency   string `json:"currency"`
	MinorUnits int64  `json:"minor_units"`
	Country    string `json:"country"`
	CardToken  string `json:"card_token"`
}

// FromRequest is the Order of a Place Order request.
func FromRequest(req *orderv1.PlaceOrderRequest) Order {
	o := Order{
		OrderID: req.GetOrderId(), CustomerID: req.GetCustomerId(),
		Currency: req.GetAmount().GetCurrency(), MinorUnits: req.GetAmount().GetMinorUnits(),
		Country: req.GetShippingAddress().GetCountry(), CardToken: req.GetCardToken(),
	}
	for _, l := range req.GetLines() {
		o.Lines = append(o.Lines, Line{ProductID: l.GetProductId(), Quantity: l.GetQuantity()})
	}
	return o
}

// Rows is a query result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// DB is the transaction the statements run on.
type DB interface {
	// Exec runs a statement and returns the rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Pgx adapts a pgx transaction.
func Pgx(tx pgx.Tx) DB { return pgxDB{tx} }

type pgxDB struct{ tx pgx.Tx }

func (d pgxDB) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := d.tx.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (d pgxDB) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := d.tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error { r.Rows.Close(); return r.Rows.Err() }

// journal records one business effect.
func journal(ctx context.Context, db DB, orderID, service, effect, detail string) error {
	if _, err := db.Exec(ctx, `INSERT INTO shop_ledger (order_id, service, effect, detail) VALUES ($1, $2, $3, $4)`,
		orderID, service, effect, detail); err != nil {
		return fmt.Errorf("%s: journal %s of order %s: %w", service, effect, orderID, err)
	}
	return nil
}

// Journal effects that complete a step, in step order.
const (
	EffectReserved   = "reserved"
	EffectAuthorized = "authorized"
	EffectBooked     = "booked"
	EffectApproved   = "approved"
)

// StepEffects is the SQL list of the effects that complete a step.
const StepEffects = `('reserved', 'authorized', 'booked', 'approved')`

// Reserve locks the stock rows of the order's products in product order,
// takes the stock and records the reservation. refused is the reason when a
// product is short (journaled; nothing is taken).
func Reserve(ctx context.Context, db DB, o Order) (refused string, err error) {
	want := map[string]int32{}
	for _, l := range o.Lines {
		want[l.ProductID] += l.Quantity
	}
	products := make([]string, 0, len(want))
	for p := range want {
		products = append(products, p)
	}
	sort.Strings(products)
	quantities := make([]int32, len(products))
	for i, p := range products {
		quantities[i] = want[p]
	}
	rows, err := db.Query(ctx, `SELECT product_id, available FROM inventory_stock WHERE product_id = ANY($1) ORDER BY product_id FOR UPDATE`, products)
	if err != nil {
		return "", fmt.Errorf("inventory: lock stock of order %s: %w", o.OrderID, err)
	}
	available := map[string]int32{}
	for rows.Next() {
		var p string
		var n int32
		if err := rows.Scan(&p, &n); err != nil {
			_ = rows.Close()
			return "", fmt.Errorf("inventory: read stock of order %s: %w", o.OrderID, err)
		}
		available[p] = n
	}
	if err := rows.Close(); err != nil {
		return "", fmt.Errorf("inventory: read stock of order %s: %w", o.OrderID, err)
	}
	for i, p := range products {
		if available[p] < quantities[i] {
			reason := "out of stock: " + p
			return reason, journal(ctx, db, o.OrderID, "inventory", "reservation_refused", p)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE inventory_stock s SET available = s.available - x.q
FROM unnest($1::text[], $2::int[]) AS x(p, q) WHERE s.product_id = x.p`, products, quantities); err != nil {
		return "", fmt.Errorf("inventory: take stock of order %s: %w", o.OrderID, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO inventory_reservations (order_id, product_id, quantity)
SELECT $1, p, q FROM unnest($2::text[], $3::int[]) AS x(p, q)`, o.OrderID, products, quantities); err != nil {
		return "", fmt.Errorf("inventory: record reservation of order %s: %w", o.OrderID, err)
	}
	return "", journal(ctx, db, o.OrderID, "inventory", EffectReserved, fmt.Sprint(products, quantities))
}

// Release gives back the stock the order holds (compensation of Reserve).
func Release(ctx context.Context, db DB, orderID string) error {
	if _, err := db.Exec(ctx, `UPDATE inventory_stock s SET available = s.available + r.quantity
FROM inventory_reservations r WHERE r.order_id = $1 AND r.released_at IS NULL AND s.product_id = r.product_id`, orderID); err != nil {
		return fmt.Errorf("inventory: release stock of order %s: %w", orderID, err)
	}
	if _, err := db.Exec(ctx, `UPDATE inventory_reservations SET released_at = now() WHERE order_id = $1 AND released_at IS NULL`, orderID); err != nil {
		return fmt.Errorf("inventory: mark reservation of order %s released: %w", orderID, err)
	}
	return journal(ctx, db, orderID, "inventory", "released", "")
}

// Authorize records the payment authorization and returns its id.
func Authorize(ctx context.Context, db DB, o Order) (string, error) {
	authID := "auth_" + uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO payment_authorizations (order_id, authorization_id, currency, minor_units)
VALUES ($1, $2, $3, $4)`, o.OrderID, authID, o.Currency, o.MinorUnits); err != nil {
		return "", fmt.Errorf("payment: authorize order %s: %w", o.OrderID, err)
	}
	return authID, journal(ctx, db, o.OrderID, "payment", EffectAuthorized, fmt.Sprint(o.MinorUnits))
}

// Void cancels the order's authorization (compensation of Authorize).
func Void(ctx context.Context, db DB, orderID string) error {
	if _, err := db.Exec(ctx, `DELETE FROM payment_authorizations WHERE order_id = $1`, orderID); err != nil {
		return fmt.Errorf("payment: void authorization of order %s: %w", orderID, err)
	}
	return journal(ctx, db, orderID, "payment", "voided", "")
}

// Schedule books the shipment and returns its tracking id.
func Schedule(ctx context.Context, db DB, o Order) (string, error) {
	tracking := "trk_" + uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO shipping_shipments (order_id, tracking_id) VALUES ($1, $2)`, o.OrderID, tracking); err != nil {
		return "", fmt.Errorf("shipping: book order %s: %w", o.OrderID, err)
	}
	return tracking, journal(ctx, db, o.OrderID, "shipping", EffectBooked, o.Country)
}

// CancelShipment cancels the order's shipment (compensation of Schedule).
func CancelShipment(ctx context.Context, db DB, orderID string) error {
	if _, err := db.Exec(ctx, `DELETE FROM shipping_shipments WHERE order_id = $1`, orderID); err != nil {
		return fmt.Errorf("shipping: cancel shipment of order %s: %w", orderID, err)
	}
	return journal(ctx, db, orderID, "shipping", "cancelled", "")
}

// Approve approves the order.
func Approve(ctx context.Context, db DB, orderID string) error {
	if _, err := db.Exec(ctx, `INSERT INTO order_approvals (order_id) VALUES ($1)`, orderID); err != nil {
		return fmt.Errorf("order: approve order %s: %w", orderID, err)
	}
	return journal(ctx, db, orderID, "order", EffectApproved, "")
}
