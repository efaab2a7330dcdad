package chaos

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/protosaga/saga/examples/placeorder/app"
	inventoryv1 "github.com/protosaga/saga/examples/placeorder/shop/inventory/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	paymentv1 "github.com/protosaga/saga/examples/placeorder/shop/payment/v1"
	shippingv1 "github.com/protosaga/saga/examples/placeorder/shop/shipping/v1"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/service"
)

// Role is a part of the Place Order example that one node runs. The fleet is
// any set of nodes whose roles together cover AllRoles, and every role may
// run in several nodes at once (relays lease outbox rows with SKIP LOCKED,
// consumers share their queue, timeout scanners claim due instances with
// SKIP LOCKED).
type Role string

// The roles.
const (
	// RoleRelay runs an outbox relay.
	RoleRelay Role = "relay"
	// RoleOrchestrator runs the saga: the consumer of its queue and its
	// timeout scanner.
	RoleOrchestrator Role = "orchestrator"
	// RoleInventory, RolePayment, RoleShipping and RoleOrder run the
	// consumer of one participant service's command queue.
	RoleInventory Role = "inventory"
	RolePayment   Role = "payment"
	RoleShipping  Role = "shipping"
	RoleOrder     Role = "order"
)

// AllRoles returns every role, in a fixed order.
func AllRoles() []Role {
	return []Role{RoleRelay, RoleOrchestrator, RoleInventory, RolePayment, RoleShipping, RoleOrder}
}

// ParticipantRoles returns the roles of the four participant services.
func ParticipantRoles() []Role {
	return []Role{RoleInventory, RolePayment, RoleShipping, RoleOrder}
}

// ParseRoles parses a comma-separated list of roles ("relay,orchestrator");
// "all" stands for AllRoles and "participants" for ParticipantRoles.
// Duplicates are dropped; an unknown name is an error.
func ParseRoles(s string) ([]Role, error) {
	var out []Role
	add := func(r Role) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for part := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(part)
		switch name {
		case "":
			continue
		case "all":
			for _, r := range AllRoles() {
				add(r)
			}
			continue
		case "participants":
			for _, r := range ParticipantRoles() {
				add(r)
			}
			continue
		}
		r := Role(name)
		if !slices.Contains(AllRoles(), r) {
			return nil, fmt.Errorf("unknown role %q (want one of %v, all or participants)", name, AllRoles())
		}
		add(r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no roles in %q", s)
	}
	return out, nil
}

// register puts the parts of the example that roles name on h, with the
// services' tables. RoleRelay is the host's Config.Relays, not a
// registration.
func register(h *host.Host, roles []Role) error {
	errs := []error{h.AddMigrations(app.Migrations())}
	for _, r := range roles {
		switch r {
		case RoleOrchestrator:
			_, err := orderv1.RegisterPlaceOrder(h, app.Decider{})
			errs = append(errs, err)
		case RoleInventory:
			errs = append(errs, inventoryv1.RegisterInventoryParticipant(h, app.Inventory{}))
		case RolePayment:
			errs = append(errs, paymentv1.RegisterPaymentParticipant(h, app.Payment{}))
		case RoleShipping:
			errs = append(errs, shippingv1.RegisterShippingParticipant(h, app.Shipping{}))
		case RoleOrder:
			errs = append(errs, orderv1.RegisterOrderParticipant(h, app.Approval{}))
		}
	}
	return errors.Join(errs...)
}

// Topology is the example's merged topology with work queues of type qt and
// retry tiers for policy p: what the fleet declares.
func Topology(qt broker.QueueType, p retry.Policy) broker.Topology {
	var t broker.Topology
	for _, pkg := range []service.Package{inventoryv1.SagaPackage(), paymentv1.SagaPackage(), shippingv1.SagaPackage(), orderv1.SagaPackage()} {
		t = t.Merge(pkg.Topology(qt, p))
	}
	return t
}
