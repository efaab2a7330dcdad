// Package sagadef holds the definition of a saga type — its steps, their
// roles and policies — and the pure state machine that interprets it.
//
// Generated code builds one [Definition] per saga declared in a contract and
// calls [Definition.Compile] once; the engine in package saga persists
// instances and calls [Definition.Begin] and [Definition.Apply] inside one
// transaction. Nothing here touches a database, a broker or a clock: time,
// ids and the user's business decisions ([Hooks]) come in through [Env], so
// a saga can be driven through any script of replies, timeouts and
// duplicates in memory (see package sagatest).
//
// The generator imports this package too: the transition table printed into
// generated code and the Mermaid diagram in the docs come from
// [Definition.Compile], so docs, generated code and run-time behaviour are
// one table. The admin console draws the same table as a picture, from
// [Definition.Edges].
//
// # States
//
// Every step has a state named after it ([StateName]: "ReserveInventory" →
// RESERVE_INVENTORY) in which the saga waits for the step's reply (or, for
// an External step, its event). Every compensatable step has a
// COMPENSATING_<STEP> state ([CompensatingStateName]) in which the saga waits
// for the reply to its compensation. Every saga also has MANUAL_REVIEW,
// where it waits for an operator, and the terminal states COMPLETED, FAILED
// (a business failure, compensations done) and CANCELLED. State names are
// stored in the database: renaming a step is a breaking change.
//
// # Roles and compensation order
//
// Steps run in contract order: compensatable steps first, then at most one
// pivot (the point of no return), then retriable steps. When a step before
// the retriable ones fails, the saga compensates the compensatable steps
// that completed, in reverse order, one compensation at a time; then it is
// FAILED. A compensatable step that stopped waiting without an answer
// (timeout, operator compensate) is compensated too: its effect may have
// happened, and compensations are idempotent. Retriable steps must not
// fail: a failure reply from one sends the saga to MANUAL_REVIEW.
//
// # Parallel groups
//
// A [Group] is consecutive steps that do not depend on one another. The
// saga waits on all of them in one state named after the group
// ("ReserveTrip" → RESERVE_TRIP); the members have no state of their own
// (their compensating states remain). Entering the group sends every
// member's command in one transition, so the engine writes them in one
// transaction: all or none. Progress.Group records each waiting member's
// pending command id, attempt and timeout, and classification works per
// member: a reply answers its member's pending command (new), an earlier
// attempt of it (late), or repeats or contradicts its member's recorded
// outcome (duplicate, conflicting). The saga moves past the group when the
// last member succeeds.
//
// A member's failure reply, a member's timeout that compensates, the
// group's own timeout, a business cancel and an operator's compensate stop
// the members still waiting; then the completed and the stopped
// compensatable members, in reverse contract order (members ran together,
// so their completion order does not matter), and the compensatable steps
// before the group are compensated one at a time. A stopped member's late
// reply follows its late-reply policy, like any step that stopped waiting.
// A member's timeout that retries resends only its command; a member's
// timeout that goes to manual review, or a spent retry budget, parks the
// whole saga. TimeoutAt is the earliest of the group's and the waiting
// members' timers; one timeout applies the first due member timer that
// ends the wait (in contract order), else the group's, else resends the
// first due member that retries. After the pivot (retriable members), a failure
// or the group's timeout goes to manual review.
//
// In manual review entered from a group, replies are recorded per member;
// an operator's retry counts recorded successes as completed and resends
// the other members' commands (a fresh budget each), and compensate
// compensates what ran. Members are never External or Conditional, and
// the pivot is never a member.
//
// # Evolution
//
// An instance persisted under one release of a definition is continued by
// the next one: Progress names steps, and the next step after a success is
// the next one in the new order that the instance has not completed (a step
// completed earlier is never sent again; a step inserted or moved before
// the instance's current step is not run for it). When a saga compensates
// and Progress names a step the definition no longer has (removed or
// renamed after it ran), its compensation cannot be sent: after the known
// steps are compensated, the saga goes to MANUAL_REVIEW naming it instead
// of ending FAILED.
//
// # Classification
//
// Apply classifies every trigger before acting on it ([Class]):
//
//   - new: the reply answers the command the saga waits on (its CausationID
//     is the pending command's id; any matching event for an External step),
//     or a timeout, deadline or operator action that is due. It is applied.
//   - duplicate: the reply repeats the outcome already recorded for its step
//     (whatever its message id). No effect.
//   - late: the reply answers a wait that has ended — an earlier attempt of a
//     resent command or compensation, a step that stopped waiting, anything
//     arriving during manual review — or a timer that is no longer armed.
//     What it does follows the late-reply table (docs/options.md, "Late
//     replies"): in MANUAL_REVIEW it is recorded in Progress (and folded
//     into the data) without a state change, so an operator's retry can
//     continue from it; a compensation's earlier answer is applied; a
//     step's earlier answer follows the step's [LatePolicy] (apply if
//     waiting, manual review, or ignore); after the step stopped waiting, a
//     message that agrees with what the saga does (a failure while it
//     compensates, a success after it completed) is audited, one that
//     contradicts it goes to manual review under that policy and is audited
//     otherwise, and a failed compensation always goes to manual review.
//     The step's role and timeout action never change that; a test derives
//     the printed table from Apply by exhaustive exploration.
//   - conflicting: the reply contradicts the outcome recorded for its step
//     (or its compensation). The saga never transitions blindly: it goes to
//     MANUAL_REVIEW with the reason, even from a terminal state.
//   - invalid: the message is not part of this saga's conversation — a type
//     the saga does not receive, or an External step's event for a step the
//     saga will not reach (it compensates or ended). No effect.
//   - early: an External step's event that arrives while the saga is still
//     on its way to that step — waiting on an earlier step or group, or in
//     manual review from one. Messages published in order are not always
//     handled in order: the reply that leads to the step can come after
//     the event. The event is recorded (folded into the data and recorded
//     as the step's outcome, the state unchanged), and when the saga
//     enters the step it settles it at once. When the saga compensates,
//     the decider skips the step, or the saga ends before reaching it, the
//     recorded event is discarded with a note in the audit trail. A second
//     event for the step while one is recorded is a duplicate (same type)
//     or conflicting (another type: manual review).
//
// A reply whose CausationID names no command this instance sent for the
// step (or compensation) its type answers — none at all, another saga's,
// or the command of another step — is none of these either: its sender got
// the conversation wrong, and Apply returns a [*CausationError] (matching
// [ErrMisaddressed]) and changes nothing, whatever the step's outcome. The
// engine marks it permanent, so the consumer parks it with a reason that
// names the header.
//
// # Timeouts and the deadline
//
// Entering a step arms TimeoutAt (now + the step's Timeout). When it fires,
// the step's [TimeoutAction] applies: compensate (the step stops waiting and
// compensation starts), retry (the command is resent with a new message id
// and the same idempotency key, since it is built from the same data, until
// MaxAttempts sends are spent, then manual review), or manual review. A
// compensation that times out is resent up to its step's MaxAttempts, then
// the saga goes to MANUAL_REVIEW: a failed compensation never goes silently
// nowhere. The saga's Deadline bounds the forward path: when it passes while
// the saga waits on a step, the saga goes to MANUAL_REVIEW; it fires once,
// and starting compensation clears it. Terminal states and MANUAL_REVIEW
// clear TimeoutAt, so a timeout scanner never finds them due.
//
// # Operator actions
//
// Operator triggers carry who and why (both required):
//
//   - retry resends what the saga waits on (in MANUAL_REVIEW: what it waited
//     on when it entered review, Progress.ReviewFrom), with a fresh attempt
//     budget; when a success for it was recorded during review, the saga
//     continues instead.
//   - compensate starts compensation from the current progress.
//   - resolve ends a saga in MANUAL_REVIEW as COMPLETED, FAILED or CANCELLED.
//   - cancel ends a non-terminal saga as CANCELLED without compensating.
//
// Operator triggers on terminal states fail with [ErrTerminal]; those the
// state does not allow with [ErrInvalidTrigger].
//
// # Business cancellation
//
// A definition may declare a cancel message ([Cancel]): a command or event
// by which the business asks to stop an instance, naming who asked and why
// in its fields. While the saga waits on a compensatable step or the pivot
// (nothing irreversible is done yet), the cancel stops that step and
// compensates the completed compensatable steps in reverse order, the step
// it stopped included, exactly as a business failure does, but the saga
// ends CANCELLED rather than FAILED (Progress.Cancel remembers the cancel
// until the end). A pivot it stopped may still answer: its late-reply
// policy applies. Past the point of no return (a pivot or retriable step
// completed, or the saga waits on a retriable step) the cancel is refused;
// while the saga compensates and after it ended it changes nothing. These
// are classified late, keep the version, and say why in the note. In
// manual review, where an operator decides, the first cancel is recorded
// (Progress.Cancel, classified late, the state unchanged): a compensation
// the operator starts then ends CANCELLED (and answers a parent that
// asked), an operator's retry drops the request. The cancel message is
// folded into the saga data only when it applies or is recorded. Who and why come from the trigger's
// Operator and Reason, or else from the message's fields
// ([Definition.CancelRequest]).
//
// # The transition table
//
// [Definition.Compile] validates a definition (reporting every problem as a
// [*DefinitionError] naming saga and step) and derives the complete
// transition table: every (from, trigger, to, emitted messages) that Apply
// can take, timeouts, retries, the compensation chain, conflicts, late
// replies, the deadline and operator actions included. The package's tests
// check the derivation against an exhaustive exploration of Apply itself on
// many definitions, so the table holds exactly the transitions Apply takes.
//
// # Purity
//
// Apply never modifies its input: the returned instance has its own copies
// of the progress maps and slices and of the saga data (cloned before
// Hooks.Apply folds a message into it). Its Version is the input's plus one
// when anything changed, and unchanged for duplicates, invalid messages,
// audited late replies and stale timers, in which case the input instance
// is returned as is.
package sagadef
