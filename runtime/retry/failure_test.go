package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/retry"
)

func pgErr(code string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "test " + code}
}

func TestClassOf(t *testing.T) {
	t.Parallel()

	base := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want retry.Class
	}{
		{"nil", nil, retry.ClassUnknown},
		{"plain", base, retry.ClassUnknown},
		{"marked permanent", retry.Permanent(base), retry.ClassPermanent},
		{"marked transient", retry.Transient(base), retry.ClassTransient},
		{"wrapped permanent", fmt.Errorf("handle: %w", retry.Permanent(base)), retry.ClassPermanent},
		{"outermost mark wins", retry.Transient(fmt.Errorf("x: %w", retry.Permanent(base))), retry.ClassTransient},
		{"mark overrides pg code", retry.Transient(pgErr("23505")), retry.ClassTransient},
		{"mark overrides pg code 2", retry.Permanent(pgErr("40001")), retry.ClassPermanent},
		{"deadline", fmt.Errorf("q: %w", context.DeadlineExceeded), retry.ClassTransient},
		{"canceled", context.Canceled, retry.ClassTransient},
		{"serialization", fmt.Errorf("update: %w", pgErr("40001")), retry.ClassTransient},
		{"deadlock", pgErr("40P01"), retry.ClassTransient},
		{"lock not available", pgErr("55P03"), retry.ClassTransient},
		{"statement timeout", pgErr("57014"), retry.ClassTransient},
		{"admin shutdown", pgErr("57P01"), retry.ClassTransient},
		{"cannot connect now", pgErr("57P03"), retry.ClassTransient},
		{"connection failure", pgErr("08006"), retry.ClassTransient},
		{"too many connections", pgErr("53300"), retry.ClassTransient},
		{"unique violation", pgErr("23505"), retry.ClassPermanent},
		{"check violation", pgErr("23514"), retry.ClassPermanent},
		{"invalid text", pgErr("22P02"), retry.ClassPermanent},
		{"syntax error", pgErr("42601"), retry.ClassUnknown},
		{"conn closed", fmt.Errorf("exec: %w", pgconn.ErrConnClosed), retry.ClassTransient},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), retry.ClassTransient},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, retry.ClassTransient},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), retry.ClassTransient},
		{"net closed", net.ErrClosed, retry.ClassTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, retry.ClassOf(tt.err), "error %v", tt.err)
		})
	}
}

func TestMarksKeepTheChain(t *testing.T) {
	t.Parallel()

	base := pgErr("23505")
	for _, marked := range []error{retry.Permanent(base), retry.Transient(base), retry.Early(base)} {
		require.ErrorIs(t, marked, base)
		var pe *pgconn.PgError
		require.ErrorAs(t, marked, &pe)
		require.Equal(t, "23505", pe.Code)
		require.Contains(t, marked.Error(), "test 23505")
	}
	require.NoError(t, retry.Permanent(nil))
	require.NoError(t, retry.Transient(nil))
	require.NoError(t, retry.Early(nil))
}

// TestEarlyIsAnExpectedTransientWait: Early is transient and says so
// through wrapping; the outermost mark decides, so a later Permanent or
// Transient mark around it is no longer early, and no other error is.
func TestEarlyIsAnExpectedTransientWait(t *testing.T) {
	t.Parallel()
	early := fmt.Errorf("saga handle: %w", retry.Early(errors.New("step not reached")))
	require.Equal(t, retry.ClassTransient, retry.ClassOf(early))
	require.True(t, retry.IsEarly(early))
	require.False(t, retry.IsEarly(retry.Transient(errors.New("flaky"))))
	require.False(t, retry.IsEarly(retry.Permanent(early)))
	require.False(t, retry.IsEarly(errors.New("plain")))
	require.False(t, retry.IsEarly(nil))
}

func TestClassString(t *testing.T) {
	t.Parallel()

	require.Equal(t, "unknown", retry.ClassUnknown.String())
	require.Equal(t, "transient", retry.ClassTransient.String())
	require.Equal(t, "permanent", retry.ClassPermanent.String())
	require.Equal(t, "unknown", retry.Class(42).String())
}
