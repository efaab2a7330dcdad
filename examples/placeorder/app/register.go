package app

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/schema"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations holds the example services' own tables (stock, reservations,
// authorizations, shipments, approvals and the shop_ledger journal).
func Migrations() schema.Source {
	sub, _ := fs.Sub(migrationsFS, "migrations") // a constant directory of the embedded tree
	return schema.Source{Name: "placeorder_shop", FS: sub}
}

// Register registers the whole Place Order example on h: the services' tables,
// the four participants and the saga, with shipping's bookings kept in the
// shop's database only. In production each service registers its own part
// on a host of its own; any number of copies of each may run.
func Register(h *host.Host) (*orderv1.PlaceOrder, error) {
	return RegisterWithManifests(h, nil)
}

// RegisterWithManifests is Register with the carriers' manifests: shipping
// also adds each booking to its carrier's manifest, under the carrier's
// PostgreSQL lease (runtime/lock) on h's database — two more commits and a
// wait per carrier for each booking. A nil manifests is Register.
func RegisterWithManifests(h *host.Host, manifests *CarrierManifests) (*orderv1.PlaceOrder, error) {
	shipping := Shipping{}
	if manifests != nil {
		locks, err := lock.NewPostgres(h.Pool(), lock.Config{OwnerPrefix: "placeorder-shipping", Telemetry: h.Telemetry()})
		if err != nil {
			return nil, h.Fail(err)
		}
		shipping = Shipping{Manifests: manifests, Locks: locks}
	}
	err := errors.Join(
		h.AddMigrations(Migrations()),
		inventoryv1.RegisterInventoryParticipant(h, Inventory{}),
		paymentv1.RegisterPaymentParticipant(h, Payment{}),
		shippingv1.RegisterShippingParticipant(h, shipping),
		orderv1.RegisterOrderParticipant(h, Approval{}),
	)
	if err != nil {
		return nil, err
	}
	return orderv1.RegisterPlaceOrder(h, Decider{})
}

// Restock sets the available stock of a product.
func Restock(ctx context.Context, pool *pgxpool.Pool, productID string, available int32) error {
	if _, err := pool.Exec(ctx, `INSERT INTO inventory_stock (product_id, available) VALUES ($1, $2)
ON CONFLICT (product_id) DO UPDATE SET available = EXCLUDED.available`, productID, available); err != nil {
		return fmt.Errorf("restock %s: %w", productID, err)
	}
	return nil
}
