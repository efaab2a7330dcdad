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
