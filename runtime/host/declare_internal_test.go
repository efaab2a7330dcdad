package host

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// TestRetryDeclare: a declaration is tried again after the broker's
// internal errors and lost channels, not after it refused what was declared.
func TestRetryDeclare(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("declare topology: declare queue \"q\": %w", err) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{wrap(&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR - Cannot declare quorum queue"}), true},
		{wrap(&amqp.Error{Code: amqp.ConnectionForced}), true},
		{wrap(amqp.ErrClosed), true},
		{wrap(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg"}), false},
		{wrap(&amqp.Error{Code: amqp.AccessRefused}), false},
		{fmt.Errorf("topology: %w", fmt.Errorf("invalid name")), false},
	} {
		require.Equal(t, tc.want, retryDeclare(tc.err), "%v", tc.err)
	}
}
