package consumer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestLockConflict(t *testing.T) {
	for code, want := range map[string]bool{"40P01": true, "40001": true, "55P03": true, "23505": false, "57P01": false} {
		err := fmt.Errorf("handler: %w", &pgconn.PgError{Code: code})
		if got := lockConflict(err); got != want {
			t.Errorf("lockConflict(%s) = %v, want %v", code, got, want)
		}
	}
	if lockConflict(errors.New("deadlock detected")) {
		t.Error("lockConflict of an error without a PostgreSQL code")
	}
}

// TestRestartsAfresh: a session that acknowledged something restarts after
// the shortest backoff, unless it ended because failed deliveries could
// not be routed, which repeats however much else it acknowledged.
func TestRestartsAfresh(t *testing.T) {
	route := fmt.Errorf("worker: %w", &routeError{errors.New("publish to \"q.retry.1s\": no route")})
	for _, tt := range []struct {
		progress bool
		err      error
		want     bool
	}{
		{true, errors.New("consuming channel closed"), true},
		{true, nil, true},
		{false, errors.New("database unavailable"), false},
		{true, route, false},
		{false, route, false},
	} {
		if got := restartsAfresh(tt.progress, tt.err); got != tt.want {
			t.Errorf("restartsAfresh(%v, %v) = %v, want %v", tt.progress, tt.err, got, tt.want)
		}
	}
}

// TestServerRejected: a commit the server refused for the batch's content
// charges an attempt; one it could not do for its own reasons does not.
func TestServerRejected(t *testing.T) {
	for code, want := range map[string]bool{
		"23505": true, "23503": true, "40001": true, "40P01": true, "P0001": true,
		"08006": false, "57P01": false, "53100": false, "53200": false, "58030": false, "F0000": false, "XX000": false,
	} {
		if got := (&commitError{err: fmt.Errorf("commit: %w", &pgconn.PgError{Code: code})}).serverRejected(); got != want {
			t.Errorf("serverRejected(%s) = %v, want %v", code, got, want)
		}
	}
	if (&commitError{err: errors.New("conn closed")}).serverRejected() {
		t.Error("an error without a PostgreSQL code was taken for the server's refusal")
	}
}
