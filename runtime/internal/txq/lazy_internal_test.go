package txq

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLazyLargeObjectsSaysWhy: pgx cannot make large objects for a
// transaction of another type; asking for them says so instead of handing
// out a value whose methods dereference nil.
func TestLazyLargeObjectsSaysWhy(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, errNoLargeObjects, func() { (&Lazy{}).LargeObjects() })
	require.PanicsWithValue(t, errNoLargeObjects, func() { (&savepoint{}).LargeObjects() })
}
