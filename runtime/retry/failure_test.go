package failure_test

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

	"github.com/protosaga/saga/runtime/failure"
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
		want failure.Class
	}{
		{"nil", nil, failure.ClassUnknown},
		{"plain", base, failure.ClassUnknown},
		{"marked permanent", failure.Permanent(base), failure.ClassPermanent},
		{"marked transient", failure.Transient(base), failure.ClassTransient},
		{"wrapped permanent", fmt.Errorf("handle: %w", failure.Permanent(base)), failure.ClassPermanent},
		{"outermost mark wins", failure.Transient(fmt.Errorf("x: %w", failure.Permanent(base))), failure.ClassTransient},
		{"mark overrides pg code", failure.Transient(pgErr("23505")), failure.ClassTransient},
		{"mark overrides pg code 2", failure.Permanent(pgErr("40001")), failure.ClassPermanent},
		{"deadline", fmt.Errorf("q: %w", context.DeadlineExceeded), failure.ClassTransient},
		{"canceled", context.Canceled, failure.ClassTransient},
		{"serialization", fmt.Errorf("update: %w", pgErr("40001")), failure.ClassTransient},
		{"deadlock", pgErr("40P01"), failure.ClassTransient},
		{"lock not available", pgErr("55P03"), failure.ClassTransient},
		{"statement timeout", pgErr("57014"), failure.ClassTransient},
		{"admin shutdown", pgErr("57P01"), failure.ClassTransient},
		{"cannot connect now", pgErr("57P03"), failure.ClassTransient},
		{"connection failure", pgErr("08006"), failure.ClassTransient},
		{"too many connections", pgErr("53300"), failure.ClassTransient},
		{"unique violation", pgErr("23505"), failure.ClassPermanent},
		{"check violation", pgErr("23514"), failure.ClassPermanent},
		{"invalid text", pgErr("22P02"), failure.ClassPermanent},
		{"syntax error", pgErr("42601"), failure.ClassUnknown},
		{"conn closed", fmt.Errorf("exec: %w", pgconn.ErrConnClosed), failure.ClassTransient},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), failure.ClassTransient},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, failure.ClassTransient},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), failure.ClassTransient},
		{"net closed", net.ErrClosed, failure.ClassTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, failure.ClassOf(tt.err), "error %v", tt.err)
		})
	}
}

func TestMarksKeepTheChain(t *testing.T) {
	t.Parallel()

	base := pgErr("23505")
	for _, marked := range []error{failure.Permanent(base), failure.Transient(base)} {
		require.ErrorIs(t, marked, base)
		var pe *pgconn.PgError
		require.ErrorAs(t, marked, &pe)
		require.Equal(t, "23505", pe.Code)
		require.Contains(t, marked.Error(), "test 23505")
	}
	require.NoError(t, failure.Permanent(nil))
	require.NoError(t, failure.Transient(nil))
}

func TestClassString(t *testing.T) {
	t.Parallel()

	require.Equal(t, "unknown", failure.ClassUnknown.String())
	require.Equal(t, "transient", failure.ClassTransient.String())
	require.Equal(t, "permanent", failure.ClassPermanent.String())
	require.Equal(t, "unknown", failure.Class(42).String())
}
