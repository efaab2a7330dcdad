package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/examples/placeorder/app"
	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/lock"
	"github.com/protosaga/saga/runtime/schema"
)

// TestManifestRefusesStaleWriter walks shipping's manifest update with a
// pause in the middle: process A takes the carrier's lease and reads the
// manifest, then stalls past its lease (a GC pause, a stopped VM); process
// B takes the lease, reads and writes its booking; A wakes and writes the
// manifest it read, which would drop B's booking. The carrier refuses A's
// write: its token is older than B's.
func TestManifestRefusesStaleWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(ctx, pool))
	locks, err := lock.NewPostgres(pool, lock.Config{RetryMin: time.Millisecond, RetryMax: 20 * time.Millisecond})
	require.NoError(t, err)
	manifests := app.NewCarrierManifests()
	const carrier, name = "Colis Rapide", "placeorder/manifest/Colis Rapide"

	a, err := locks.Acquire(ctx, name, 100*time.Millisecond)
	require.NoError(t, err)
	readByA, err := manifests.Read(carrier, a.Token)
	require.NoError(t, err)

	// A stalls; B waits for the lease, which expires under A.
	b, err := locks.Acquire(ctx, name, time.Minute)
	require.NoError(t, err)
	readByB, err := manifests.Read(carrier, b.Token)
	require.NoError(t, err)
	require.NoError(t, manifests.Write(carrier, b.Token, append(readByB, "o-b")))
	require.NoError(t, b.Release(ctx))

	// A wakes and carries on.
	err = manifests.Write(carrier, a.Token, append(readByA, "o-a"))
	var stale *lock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, lock.StaleTokenError{Resource: carrier, Token: a.Token, Highest: b.Token}, *stale)
	require.Equal(t, []string{"o-b"}, manifests.Orders(carrier), "B's booking survives A's late write")
	require.ErrorIs(t, a.Release(ctx), lock.ErrLost, "A learns it lost the lease")
}
