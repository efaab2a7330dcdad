package saga_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/sagadef"
)

// evolve returns a compiled copy of def changed by edit: the next release of
// the contract, as regenerated code would carry it.
func evolve(t *testing.T, def *sagadef.Definition, edit func(*sagadef.Definition)) *sagadef.Definition {
	t.Helper()
	next := &sagadef.Definition{
		Name: def.Name, Table: def.Table, StartMessage: def.StartMessage, DataMessage: def.DataMessage,
		Deadline: def.Deadline, Steps: slices.Clone(def.Steps),
	}
	edit(next)
	require.NoError(t, next.Compile())
	return next
}

// upgrade deploys next over the bundle's table: the state constraint is
// replaced as the generated states migration does (it found no instance in
// a removed state), and the engine runs the new definition.
func (b *testBundle) upgrade(t *testing.T, next *sagadef.Definition) {
	t.Helper()
	states := make([]string, len(next.States))
	for i, s := range next.States {
		states[i] = "'" + s.Name + "'"
	}
	table := pgx.Identifier{next.Table}.Sanitize()
	_, err := b.pool.Exec(context.Background(), `ALTER TABLE `+table+` DROP CONSTRAINT `+next.Table+`_state_check;
ALTER TABLE `+table+` ADD CONSTRAINT `+next.Table+`_state_check CHECK (state IN (`+strings.Join(states, ", ")+`))`)
	require.NoError(t, err)
	b.def = next
	b.engine = b.newEngine(t, nil)
}

// TestEvolutionRemovedCompensatableStep: a saga that completed a
// compensatable step under one release, and fails under a release whose
// definition no longer has that step (renamed or removed: the states
// migration passes, as no instance waits in its states), must not end
// FAILED with the step's effect silently left in place.
func TestEvolutionRemovedCompensatableStep(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "order-1")
	require.Equal(t, stPayment, b.mustReply(t, id, msgInventoryReserved).State)

	b.upgrade(t, evolve(t, b.def, func(d *sagadef.Definition) {
		d.Steps[0].Name = "ReserveStock"
	}))
	st := b.mustReply(t, id, msgPaymentDeclined)
	require.Equal(t, stManualReview, st.State, "the release of ReserveInventory's effect cannot be sent by this definition")
	require.Contains(t, st.ReviewReason, "ReserveInventory")
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment"}, outboxTypes(b.outbox(t, id)))
}
