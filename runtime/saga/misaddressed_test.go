package saga_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// TestMisaddressedReplyIsRefused: a reply whose x-causation-id names no
// command the saga sent for what the reply answers is refused as permanent
// (the consumer parks it) with a reason that names the header that is
// wrong, and changes nothing: no state, no version, no audit row. Also for a
// step already settled, where it would otherwise pass as a duplicate or a
// conflict.
func TestMisaddressedReplyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	id := b.start(t, "o-mis")
	other := b.start(t, "o-other")
	reserve := b.status(t, id).PendingMessageID
	otherReserve := b.status(t, other).PendingMessageID

	refused := func(sagaID string, m testMsg, causation, reason string) {
		t.Helper()
		before, trail := b.status(t, id), len(b.history(t, id))
		msgID, err := b.reply(t, sagaID, m, causation)
		require.ErrorIs(t, err, sagadef.ErrMisaddressed)
		require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))
		require.Equal(t, "permanent: misaddressed reply: message "+msgID+" ("+m.SagaMessageInfo().FullName+") to saga "+sagaTypeName+" "+id+
			": header x-causation-id "+reason, err.Error())
		after := b.status(t, id)
		require.Equal(t, before.Version, after.Version, "nothing applied")
		require.Equal(t, before.State, after.State)
		require.Len(t, b.history(t, id), trail, "nothing audited")
	}
	want := "a reply carries the message id of the command it answers, here the command of step ReserveInventory"
	refused(id, msg(msgInventoryReserved, "o-mis"), "", "is missing; "+want)
	refused(id, msg(msgInventoryReserved, "o-mis"), "no-such-command", `"no-such-command" names no command this saga sent; `+want)
	refused(id, msg(msgInventoryReserved, "o-mis"), otherReserve,
		fmt.Sprintf("%q names ReserveInventory of saga %s %s, but header x-saga-id names saga %s", otherReserve, sagaTypeName, other, id))
	refused("", msg(msgInventoryReserved, "o-mis"), otherReserve,
		fmt.Sprintf("%q names ReserveInventory of saga %s %s, but its correlation key (no x-saga-id) names saga %s", otherReserve, sagaTypeName, other, id))
	refused(id, msg(msgPaymentAuthorized, "o-mis"), reserve,
		fmt.Sprintf("%q names the command of step ReserveInventory, but PaymentAuthorized answers the command of step AuthorizePayment", reserve))
	refused(id, msg(msgInventoryReleased, "o-mis"), reserve,
		fmt.Sprintf("%q names the command of step ReserveInventory, but InventoryReleased answers the compensation of step ReserveInventory", reserve))

	// A settled step: the same outcome with a wrong causation is no
	// duplicate, another outcome no conflict.
	require.Equal(t, stPayment, b.mustReply(t, id, msgInventoryReserved).State)
	refused(id, msg(msgInventoryReserved, "o-mis"), "stray", `"stray" names no command this saga sent; `+want)
	refused(id, msg(msgInventoryFailed, "o-mis"), "stray", `"stray" names no command this saga sent; `+want)
	_, err := b.reply(t, id, msg(msgInventoryReserved, "o-mis"), reserve)
	require.NoError(t, err)
	h := b.history(t, id)
	require.Equal(t, sagadef.ClassDuplicate.String(), h[len(h)-1].Class, "with its causation, the copy is a duplicate")
}
