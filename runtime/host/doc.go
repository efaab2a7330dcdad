// Package host runs a service's part of the sagas in one process, so that a
// service is its business code plus one call.
//
// Generated code registers what the contract declares for the service:
//
//	h, err := host.New(ctx, cfg)                                   // or host.Main(func(h *host.Host) error { ... })
//	err = inventoryv1.RegisterInventoryParticipant(h, inventory{}) // consumes inventory.commands
//	placeOrder, err := orderv1.RegisterPlaceOrder(h, decider{})    // consumes order.saga.place_order
//	err = h.Run(ctx)                                               // until ctx ends, then stops in order
//
// # What Start does, in order
//
//  1. Applies the migrations of what is registered (the runtime's tables,
//     the participants' once records, each saga's instance table, then the
//     service's own from Config.Migrations and AddMigrations) under
//     schema.Migrate's advisory lock, so several processes may start at
//     once; Config.SkipMigrations leaves that to another tool.
//  2. Checks each saga's stored states against its definition
//     (saga.Engine.CheckStates): a state removed while instances occupy it
//     stops the start with a clear message.
//  3. Opens two broker connections (publishing and consuming apart, so a
//     broker that blocks publishers under an alarm does not stall acks)
//     and declares the topology merged from the packages of everything
//     registered ([Package.Topology] of each).
//  4. Starts the outbox relays, one consumer per registered queue (rows a
//     consumer commits are handed to a relay of this process), each saga's
//     timeout scanner, the callback dispatcher when Config.Callbacks is set
//     (it stops with the relays), and the HTTP server.
//
// # Defaults that keep the guarantees
//
// A participant registered through the host handles each command once per
// command type and idempotency key (participant.Idempotent): a command the
// saga resends after a timeout, or an operator retries, gets the first reply
// again instead of a second effect, without the participant's code
// mentioning idempotency. A compensating command that arrives before the
// command it undoes leaves a record that makes the late command a no-op
// (see package participant).
//
// # Configuration
//
// [Main] reads it from the environment ([FromEnv]); [New] takes a [Config].
//
//	SAGA_PG_URL        PostgreSQL URL (required)
//	SAGA_AMQP_URL      RabbitMQ URL, amqp:// or amqps:// (required)
//	SAGA_AMQP_CA       PEM file of the CA of the broker's certificate (default: the system's roots)
//	SAGA_SERVICE       service name in connection names and logs (default: the executable's name)
//	SAGA_HTTP_ADDR     where to serve HTTP (default "127.0.0.1:8080"; ":8080" for every interface; "off": none)
//	SAGA_HTTP_START    "true": serve POST /sagas/<saga> for every registered saga
//	SAGA_ADMIN_TOKENS  "name:role:token,..." for the admin API and console (none: not served)
//	SAGA_ADMIN_TOKENS_FILE  a file holding that list instead, read again when it changes and on SIGHUP
//	SAGA_QUEUE_TYPE    "quorum" (default) or "classic"
//	SAGA_RELAYS        outbox relays in this process (default 1; 0: none)
//	SAGA_CONCURRENCY   workers per consumer (default 4)
//	SAGA_MIGRATE       "false": apply no migrations at start
//	SAGA_LOG_LEVEL     debug, info (default), warn or error
//	SAGA_LOG_FORMAT    json (default) or text
//	SAGA_CALLBACK_KEYS     "ID:SECRET[,ID:SECRET]": run a callback dispatcher signing with these keys, current first
//	SAGA_CALLBACK_ALLOW    address classes callbacks may reach: loopback, private, link-local (default: none)
//	SAGA_CALLBACK_CLIENTS  "CLIENT=URL,...": client endpoints for contracts that name a client_field
//
// The retry policy, per-queue tuning, step timeouts, telemetry providers and
// participant middleware are set in Config.
//
// # HTTP
//
// On Config.HTTPAddr (default "127.0.0.1:8080", loopback only: a container
// sets ":8080"): GET /healthz (the process runs),
// GET /readyz (started, database and broker reachable), GET /metrics
// (Prometheus, unless Config.Telemetry brings its own meter: the runtime's
// metrics, the Go runtime's and the process's, target_info naming the
// service), the saga endpoints under /sagas/<saga>/ and, with admin
// tokens, the admin API and console under /admin/ (see runtime/admin).
//
// # Logs and traces
//
// The host logs JSON (telemetry.NewLogHandler) with the saga, message,
// correlation and causation ids of the message being handled and the
// trace and span ids. Without a tracer of the user's (Config.Telemetry),
// the host's tracer records nothing but gives every saga start, message
// and admin request a trace id, so that one saga's log lines, across
// services, share theirs. Failed admin sign-ins are logged (Warn) and
// limited per client address (admin.Config.MaxFailedSignIns).
//
// # Stopping
//
// Stop (and Run, when its context ends or a part fails) turns readiness
// off, stops the consumers, which finish their in-flight batches within
// Config.DrainTimeout, and the timeout scanners; then stops the relays, which
// publish what the consumers' last batches handed them; then shuts the HTTP
// server down and closes the connections.
package host
