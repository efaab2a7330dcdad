// Package sagatest drives a saga definition in memory: a [Harness] holds one
// instance, a fake clock and sequential message ids, and feeds the pure
// state machine of package sagadef a script of replies, duplicates,
// timeouts, deadlines and operator actions, recording every result.
//
//	h := sagatest.New(t, def, hooks)
//	h.Start(placeOrder)
//	h.RequireState("RESERVE_INVENTORY")
//	h.RequireSent("shop.v1.ReserveInventory")
//	h.Reply(inventoryReserved)      // answers the pending command
//	h.Duplicate()                   // same reply again, new message id
//	h.RequireClass(sagadef.ClassDuplicate)
//	h.Timeout()                     // clock past timeout_at, timeout fires
//	h.OperatorCompensate("stock gone") // operator actions, with a reason
//
// Every Apply the harness makes is also checked: for purity (the input
// instance, its progress maps and slices and its saga data, must be
// unchanged afterwards) and against the transition table (every transition
// taken must be a row of Definition.Transitions).
//
// A [Scenario] is a path written out with what each move must lead to
// (state, classification, messages sent) and its final state,
// compensations and skipped conditional steps; [RunScenarios] drives a
// harness through a list of them, deciding the conditional steps as each
// scenario says.
// protoc-gen-saga computes every saga's scenarios from its step graph and
// generates a test running them on [StubHooks].
//
// Generated code wraps a Harness in a typed helper per saga. For tests that
// have no generated code, [NewType], [NewMessage] and [Hooks] provide test
// messages of any full name and hooks that record what they folded.
package sagatest
