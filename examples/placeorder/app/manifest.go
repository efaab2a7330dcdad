package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/retry"
)

// CarrierManifests stands in for the carriers' own systems, outside the
// shop's database: each carrier keeps one pickup manifest (the orders it
// collects), which shipping rewrites whole with each booking — read it, add
// the order, write it back. Two shipping processes doing that at once for
// one carrier would drop a booking, so shipping holds the carrier's lease
// while it does (see Shipping). A lease can run out while its holder is
// paused, so the store, like a real one that supports fencing, takes the
// lease's fencing token with every read and write and refuses a token lower
// than one it has seen: the paused holder's late write is refused instead
// of overwriting the next holder's manifest. It is safe for concurrent use.
type CarrierManifests struct {
	fence lock.Fence
	mu    sync.Mutex
	docs  map[string][]string
}

// NewCarrierManifests returns empty manifests.
func NewCarrierManifests() *CarrierManifests {
	return &CarrierManifests{docs: map[string][]string{}}
}

// Read returns the carrier's manifest to a holder of token, or a
// *lock.StaleTokenError. A read counts as access: once a holder has read
// with its token, no older token writes.
func (m *CarrierManifests) Read(carrier string, token int64) ([]string, error) {
	var out []string
	err := m.fence.Write(carrier, token, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		out = slices.Clone(m.docs[carrier])
		return nil
	})
	return out, err
}

// Write replaces the carrier's manifest for a holder of token, or returns a
// *lock.StaleTokenError and changes nothing.
func (m *CarrierManifests) Write(carrier string, token int64, orders []string) error {
	return m.fence.Write(carrier, token, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.docs[carrier] = slices.Clone(orders)
		return nil
	})
}

// Carriers returns the carriers that have a manifest, sorted.
func (m *CarrierManifests) Carriers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.docs))
	for c := range m.docs {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Orders returns the carrier's manifest as it stands, for reading only.
func (m *CarrierManifests) Orders(carrier string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.docs[carrier])
}

// manifestLease is how long shipping holds a carrier's lease: far longer
// than one read and write take.
const manifestLease = 10 * time.Second

// addToManifest adds the order to the carrier's manifest under the
// carrier's lease, with its fencing token on the read and the write. The
// command may run again (a redelivery, or a retry after the database
// transaction around it failed): an order already on the manifest is left
// as it is.
func addToManifest(ctx context.Context, locks *lock.Locker, manifests *CarrierManifests, carrier, orderID string) error {
	written := false
	err := locks.Do(ctx, "placeorder/manifest/"+carrier, manifestLease, func(ctx context.Context, lease *lock.Lease) error {
		orders, err := manifests.Read(carrier, lease.Token)
		if err != nil {
			return err
		}
		if !slices.Contains(orders, orderID) {
			if err := manifests.Write(carrier, lease.Token, append(orders, orderID)); err != nil {
				return err
			}
		}
		written = true
		return nil
	})
	switch {
	case err == nil:
		return nil
	case written && errors.Is(err, lock.ErrLost):
		// The lease ran out after the write, which the carrier accepted:
		// no newer holder had touched the manifest, and any later one
		// reads it with this order on it.
		return nil
	case errors.Is(err, lock.ErrStaleToken) || errors.Is(err, lock.ErrLost):
		// A newer holder took over while this one paused: run the
		// command again later, under a new lease.
		return retry.Transient(fmt.Errorf("shipping: add order %s to the %s manifest: %w", orderID, carrier, err))
	default:
		return fmt.Errorf("shipping: add order %s to the %s manifest: %w", orderID, carrier, err)
	}
}
