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
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
)

// DeclinedCard is the card token the example payment service declines, like
// a payment provider's test card.
const DeclinedCard = "tok_declined"

// Services, as participant.Idempotent records their effects. Idempotent scopes
// each record by command type too, so ReserveInventory and ReleaseInventory,
// which share their idempotency key (the order id), keep separate records.
const (
	scopeInventory = "inventory"
	scopeAuthorize = "payment"
	scopeShip      = "shipping"
	scopeApprove   = "order"
)

// once runs fn at most once per idempotency key of cmd within scope, in tx,
// through participant.Idempotent: a command resent by the saga (a new message
// id with the same key, after a step timeout) gets the first reply again
// instead of a second effect.
func once[R message.Message](ctx context.Context, tx pgx.Tx, reg *message.Registry, scope string, cmd message.Message,
	fn func() (R, error),
) (R, error) {
	var zero R
	reply, err := participant.Idempotent(scope, reg, func(context.Context, pgx.Tx, message.Message) (message.Message, error) {
		return fn()
	})(ctx, tx, cmd)
	if err != nil || reply == nil {
		return zero, err
	}
	r, ok := reply.(R)
	if !ok {
		return zero, failure.Permanent(fmt.Errorf("%s: stored reply %s does not answer %s",
			scope, reply.SagaMessageInfo().FullName, cmd.SagaMessageInfo().FullName))
	}
	return r, nil
}

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
type Inventory struct {
	reg     *message.Registry
	crashes *Crashes // nil outside chaos runs
}

var _ inventoryv1.InventoryParticipant = (*Inventory)(nil)

// ReserveInventory holds every line of the order, or nothing: a line that
// cannot be held answers InventoryReservationFailed (a business failure) and
// holds no stock at all.
func (s *Inventory) ReserveInventory(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReserveInventory) (inventoryv1.ReserveInventoryResult, error) {
	return once(ctx, tx, s.reg, scopeInventory, cmd, func() (inventoryv1.ReserveInventoryResult, error) {
		return s.reserve(ctx, tx, cmd)
	})
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

func (s *Inventory) reserve(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReserveInventory) (inventoryv1.ReserveInventoryResult, error) {
	orderID := cmd.GetOrderId()
	refuse := func(reason string) (inventoryv1.ReserveInventoryResult, error) {
		if err := journal(ctx, tx, orderID, "inventory", "reservation_refused", reason); err != nil {
			return nil, err
		}
		return &inventoryv1.InventoryReservationFailed{OrderId: orderID, Reason: reason}, nil
	}
	// The lock and the check go out in one round trip; the check still
	// runs after the lock is granted (with a snapshot taken then), so a
	// release that committed meanwhile is seen.
	var b pgx.Batch
	b.Queue(lockStockSQL)
	var released bool
	// An aggregate over the order's rows rather than EXISTS: with EXISTS
	// and no statistics yet (a new table) the planner expects a match at
	// once and scans the whole table, and a plan cached then stays.
	b.Queue(`SELECT coalesce(bool_or(released_at IS NOT NULL), false) FROM inventory_reservations
WHERE order_id = $1`, orderID).QueryRow(func(r pgx.Row) error { return r.Scan(&released) })
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return nil, fmt.Errorf("inventory: lock stock and check releases of order %s: %w", orderID, err)
	}
	if released {
		// The compensation overtook the reservation: holding stock now
		// would leak it, since nobody will release it again.
		return refuse("order already released")
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

// ReleaseInventory gives back whatever the order holds. Releasing an order
// that holds nothing succeeds (and leaves a tombstone that refuses a
// reservation arriving later).
func (s *Inventory) ReleaseInventory(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReleaseInventory) (inventoryv1.ReleaseInventoryResult, error) {
	return once(ctx, tx, s.reg, scopeInventory, cmd, func() (inventoryv1.ReleaseInventoryResult, error) {
		return s.release(ctx, tx, cmd)
	})
}

func (s *Inventory) release(ctx context.Context, tx pgx.Tx, cmd *inventoryv1.ReleaseInventory) (inventoryv1.ReleaseInventoryResult, error) {
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
		if _, err := tx.Exec(ctx, `INSERT INTO inventory_reservations (order_id, product_id, quantity, released_at)
VALUES ($1, '', 0, now()) ON CONFLICT DO NOTHING`, orderID); err != nil {
			return nil, fmt.Errorf("inventory: record release of order %s: %w", orderID, err)
		}
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
	s.crashes.markCompensation(tx)
	s.crashes.pass(CrashMidCompensation)
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
type Payment struct{ reg *message.Registry }

var _ paymentv1.PaymentParticipant = (*Payment)(nil)

// AuthorizePayment authorizes the amount, or declines it (a business failure)
// for DeclinedCard and for amounts that are not positive.
func (s *Payment) AuthorizePayment(ctx context.Context, tx pgx.Tx, cmd *paymentv1.AuthorizePayment) (paymentv1.AuthorizePaymentResult, error) {
	return once(ctx, tx, s.reg, scopeAuthorize, cmd, func() (paymentv1.AuthorizePaymentResult, error) {
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
	})
}

// Shipping is the shipping service: it books a shipment. Its step comes after
// the pivot, so it never answers with a business failure: it either books or
// returns an error, and the message is retried.
type Shipping struct{ reg *message.Registry }

var _ shippingv1.ShippingParticipant = (*Shipping)(nil)

// ScheduleShipping books the shipment of an order.
func (s *Shipping) ScheduleShipping(ctx context.Context, tx pgx.Tx, cmd *shippingv1.ScheduleShipping) (shippingv1.ScheduleShippingResult, error) {
	return once(ctx, tx, s.reg, scopeShip, cmd, func() (shippingv1.ScheduleShippingResult, error) {
		orderID, country := cmd.GetOrderId(), cmd.GetAddress().GetCountry()
		if country == "" {
			// After the pivot there is no business failure to answer
			// with: this is a bad command, parked for an operator.
			return nil, failure.Permanent(errors.New("shipping: address without country for order " + orderID))
		}
		var carrier string
		err := tx.QueryRow(ctx, `SELECT carrier FROM shipping_carriers WHERE country = $1`, country).Scan(&carrier)
		if errors.Is(err, pgx.ErrNoRows) {
			// Retrying cannot help: park the command until an operator
			// adds a carrier for the country and replays it.
			return nil, failure.Permanent(fmt.Errorf("shipping: no carrier serves country %q (order %s); add one to shipping_carriers, then replay this message", country, orderID))
		}
		if err != nil {
			return nil, fmt.Errorf("shipping: find a carrier for %s (order %s): %w", country, orderID, err)
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
	})
}

// Approval is the order service's own step: it marks the order approved.
type Approval struct{ reg *message.Registry }

var _ orderv1.OrderParticipant = (*Approval)(nil)

// ApproveOrder approves the order.
func (s *Approval) ApproveOrder(ctx context.Context, tx pgx.Tx, cmd *orderv1.ApproveOrder) (orderv1.ApproveOrderResult, error) {
	return once(ctx, tx, s.reg, scopeApprove, cmd, func() (orderv1.ApproveOrderResult, error) {
		orderID := cmd.GetOrderId()
		if err := participant.Defer(ctx, tx, "order: approve order "+orderID,
			`INSERT INTO order_approvals (order_id) VALUES ($1)`, orderID); err != nil {
			return nil, err
		}
		if err := journal(ctx, tx, orderID, "order", "approved", ""); err != nil {
			return nil, err
		}
		return &orderv1.OrderApproved{OrderId: orderID}, nil
	})
}

// answer dispatches a delivered command to the typed method of whichever
// service owns it, for Script and Faults, which must run a participant
// without sending its reply. The command's envelope goes along, as
// participant.Handler passes it, so that an operator's retry is recorded
// under its own key.
func (a *App) answer(ctx context.Context, tx pgx.Tx, d *consumer.Delivery) (message.Message, error) {
	ctx, cmd := participant.WithCommand(ctx, &d.Envelope), d.Message
	switch c := cmd.(type) {
	case *inventoryv1.ReserveInventory:
		return asMessage(a.inventory.ReserveInventory(ctx, tx, c))
	case *inventoryv1.ReleaseInventory:
		return asMessage(a.inventory.ReleaseInventory(ctx, tx, c))
	case *paymentv1.AuthorizePayment:
		return asMessage(a.payment.AuthorizePayment(ctx, tx, c))
	case *shippingv1.ScheduleShipping:
		return asMessage(a.shipping.ScheduleShipping(ctx, tx, c))
	case *orderv1.ApproveOrder:
		return asMessage(a.approval.ApproveOrder(ctx, tx, c))
	}
	return nil, failure.Permanent(fmt.Errorf("no participant for command %s", cmd.SagaMessageInfo().FullName))
}

func asMessage[R message.Message](r R, err error) (message.Message, error) {
	if err != nil {
		return nil, err
	}
	return r, nil
}
