// Package admin is the operators' surface of a saga deployment: an
// authenticated JSON API and a web console, served by one http.Handler, to
// find stuck sagas and parked messages, understand one saga's timeline, and
// repair it through audited, version-guarded actions.
//
//	srv, err := admin.New(admin.Config{Pool: pool, Sagas: []*saga.Engine{placeOrder.Engine()}, Tokens: tokens})
//	http.ListenAndServe(addr, srv)                                     // console at /, API at /api/
//	mux.Handle("/admin/", http.StripPrefix("/admin", srv))             // or under a prefix
//
// cmd/sagactl is a client of the same API; docs/operators.md is the
// operator's guide.
//
// # What it reads
//
// The saga instance tables of the configured engines (by their compiled
// definitions' Table, quoted with pgx.Identifier; every value is a query
// parameter), saga_audit (transitions with their cause), saga_outbox (the
// messages a saga sent and the replies written for it) and saga_parked (the
// parking lot's index, joined to each message's saga and step). Nothing is
// cached: every answer reflects the database at the time of the request.
//
// It answers, besides: counts of instances per state and type (with the
// stuck ones) and of open parked messages per queue (GET /api/stats); a
// search by saga id, business key or its start, message id or correlation
// id (GET /api/search); the log of operator actions across sagas, read from
// saga_audit (GET /api/operator-log); and, in a timeline, the repairs the
// state machine allows now with what each would do (Timeline.Actions).
//
// A parked message that names no saga (an event published without saga
// metadata, which its saga's consumer finds by the message's correlation
// field) is joined to the saga that field names (Parked.LinkedBy): it is
// listed under the saga, checked against it before a replay, and its
// replay is audited in the saga's trail. Every open parked copy has a
// standing from the same check a replay makes: current (replaying it would
// act) or superseded (the saga resent the command since, moved past the
// step, or ended).
//
// A saga is stuck by saga.StuckRule, the rule of the
// saga.instances.stuck gauge: it waits on a step (or a compensation) and,
// by more than Config.StuckGrace, its timeout_at or deadline_at is past
// due, or it has not changed for longer than the step's timeout from the
// contract. Sagas in manual review are listed separately, with their
// reason.
//
// # Repairs and their guarantees
//
//   - Retry, compensate, resolve and cancel go through saga.Engine.OperateTx:
//     the state machine decides whether the action is allowed, the instance's
//     version must equal the version the operator decided on (409
//     version_conflict otherwise: a live reply or timeout got there first),
//     and the engine writes the audit row with the principal's name as
//     operator and the required reason. The server locks the instance row
//     before deciding, so a repeated request is recognised: a saga already in
//     the target state of cancel/resolve, or whose audit trail shows the same
//     principal applied the same action from the same version, answers
//     already_applied and changes nothing.
//   - Replaying a parked message first checks the saga's state: the state
//     machine classifies the message against the instance now (a reply the
//     saga still waits for is new; one whose outcome is recorded is a
//     duplicate and is refused; a command is only replayed while the saga
//     still waits on exactly that message id). The replay then takes the
//     normal path: the message goes back into the outbox with its own message
//     id and original exchange and routing key (the outbox row of that id is
//     released for the relay when it exists, otherwise a row is written from
//     the parked copy), the relay publishes it, and the consumer's inbox and
//     the saga's classification decide its effect — a message that was
//     already applied has no second effect. In the same transaction the
//     parked row (and every open row of the same message and routing) is
//     marked replayed with who and when, and a TriggerReplay row with the
//     reason is written to the saga's audit trail. A replayed row is never
//     replayed again.
//   - Dismissing a parked copy closes it without a replay, in one
//     transaction that locks the row and its saga's, records who, when and
//     why on the row and writes a TriggerDismiss row in the saga's audit
//     trail. A current copy is dismissed only when forced; a bulk
//     dismissal never closes one.
//   - Bulk forms apply one action to every saga (or parked message) matching
//     a filter, each in its own transaction with the version it was listed
//     at; dry_run reports what each would do without changing anything: for
//     a saga, the state its machine would take it to and what it would send
//     (sagadef.Definition.Apply on a copy of the instance, with hooks that
//     build empty messages instead of calling the user's code).
//
// # Security
//
// Every /api/ request needs a bearer token (Config.Tokens, replaceable at
// run time with Server.SetTokens); read tokens may list and inspect, repair
// tokens may also repair (403 otherwise). Tokens are compared as SHA-256
// digests in constant time and never logged. A request with a missing or
// unknown token is logged; a client address that sends too many unknown
// tokens in a window (Config.MaxFailedSignIns) is refused every request
// (429) until the window ends. The console's static files need no token:
// the page asks for one and keeps it in the tab's sessionStorage; it offers
// only the repairs a saga's state allows, each behind a confirmation that
// names its effect. Answers carry a strict Content-Security-Policy
// (same-origin scripts and styles only; the console uses no external
// resources) and the console builds its DOM from text, never from HTML
// strings; the one markup it inserts, the state diagram the server draws
// (GET /api/types/{type}/diagram.svg, drawn by runtime/admin/internal/diagram), is parsed as
// XML and pruned to an allowlist of SVG elements and attributes first.
// Message bodies and saga data are decoded through the message registries
// and shown as protojson with every field the contract marks sensitive
// replaced by "[REDACTED]" (saga data with the sensitive paths of every
// message its saga names; when one of those types is unknown, saga data is
// not shown at all); a body of an unknown type is shown by size only.
// Inputs are validated (UUIDs, known types and states, page sizes, cursors,
// unknown parameters and JSON fields) with 400 answers that say what is
// wrong.
package admin
