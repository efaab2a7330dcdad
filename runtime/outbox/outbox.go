// Package outbox makes publishing part of a database transaction: messages
// are written as saga_outbox rows in the caller's transaction ([Enqueue],
// [Publish]) and a [Relay] moves committed rows to RabbitMQ.
//
// # Guarantees
//
//   - Nothing uncommitted is published: the relay only sees committed rows.
//   - Nothing committed is lost: a row is marked published only after the
//     broker confirmed it and did not return it as unroutable; every other
//     outcome (nack, return, confirm timeout, channel or connection loss,
//     relay crash) leaves it unpublished, and it is published again.
//   - Delivery is therefore at-least-once. A row can be published twice (a
//     relay dies between publish and mark, its lease runs out mid-batch, or
//     other relays take it for dead while its database session is cut);
//     both copies carry the same message id, and consumers drop the second
//     through the inbox. There is no global order: a relay publishes its
//     batch in id order (so messages of one transaction keep their order
//     unless one of them has to be republished), but several relays run
//     side by side.
//
// # How the relay works
//
// Storage: an outbox row is written once and never updated. A trigger
// gives every inserted row, whoever writes it, a row in
// saga_outbox_pending; the relay deletes that row once the broker
// confirmed the message and records the publish in saga_outbox_sent (when,
// by which relay, after how many leases). Leases live on the narrow pending
// row, so neither a lease nor a publish copies the message body or adds
// index entries to the outbox (schema migration 0007; the view
// saga_outbox_state joins the three).
//
// Retention: published rows are kept, with their saga_outbox_sent records,
// for RelayConfig.KeepPublished (7 days by default); every running relay
// deletes older ones with [Prune] every PruneInterval (a minute by default).
// sagactl prune runs the same by hand. An operator's [Republish] of a
// message still in the outbox makes its row pending again; of a pruned one,
// it enqueues a new row.
//
// Leases: one statement claims a batch — UPDATE saga_outbox_pending …
// WHERE id = ANY(ARRAY(SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP
// LOCKED)) — setting lease_owner, lease_until = now() + LeaseDuration and
// attempts = attempts + 1, reading the messages from saga_outbox, and
// commits at once. Row locks are held only for that statement; the lease is
// what keeps other relays off the rows while they are published, and
// because it expires, a relay that dies holding one delays its rows by at
// most LeaseDuration. Any number of relays can run at once: SKIP LOCKED
// hands each a disjoint batch.
//
// Liveness: a running relay also holds an advisory lock named after its
// schema and owner on its LISTEN connection, which PostgreSQL drops when the
// session ends, as it does when the process dies, and registers in
// saga_outbox_relays while it holds it. About once per PollInterval each
// relay looks at the registered owners; one whose lock has stayed free for
// its grace (three of its polls) is gone, and its leased rows (claimed, or handed over by a
// consumer of its process) are released at once instead of waiting for
// LeaseDuration. A relay that cannot take its lock is not registered and
// keeps the lease as its only guard; a relay that stops cleanly deletes its
// registration before it lets go of the lock. Taking a live relay for dead
// (its session cut for longer than the grace) can only cause a duplicate. Relays
// need session-level connections: not a pooler in transaction mode.
//
// No transaction is held across network I/O: a transaction open while
// waiting for the broker would pin row locks, a connection and the xmin
// horizon for as long as the broker is slow or gone. Instead the claim
// commits before publishing and one statement afterwards records the
// confirmed rows as sent and releases the failed ones (lease cleared,
// retried after a short backoff for nacks and returns, at once for lost
// connections) — at most one commit per batch, not per message.
//
// The relay is a pipeline of four stages joined by bounded channels, so
// neither the database round trips nor a batch's confirm tail leave the
// broker idle: the claimer leases the next batch while the current one is
// published (at most two batches ahead); the sender publishes batch after
// batch and waits only while Window confirms are outstanding across
// batches; the awaiter collects each batch's confirms in order; the settler
// merges the outcomes that queued up while its last statement ran into one
// statement. On shutdown, batches already sent are finished, hand-offs
// already queued are sent, and batches claimed but not sent are released at
// once, bounded by ConfirmTimeout.
//
// Hand-off: a relay named on a transaction's wake set by its owner (a
// consumer's Config.Relay, a saga engine's HandOffTo) gets the rows
// enqueued in it straight after the commit, inserted
// already leased to it, and publishes them without claiming them: no claim
// statement, no lease update, no notification. The sender merges queued
// hand-offs into batches of up to BatchSize rows and interleaves them with
// claimed batches; confirms, settling and failures are the same for both.
// Rows a relay cannot take (it is stopping, or its queue is full) are
// released at once for any relay to claim.
//
// Publishing uses a [broker.Publisher]: confirm mode with a bounded window of
// outstanding confirms, mandatory publishes with returns counted as
// failures.
//
// Wake-ups: relays LISTEN on NotifyChannel on a dedicated connection (taken
// out of the pool), reconnecting with backoff, and poll every PollInterval as
// a fallback; notifications are only hints. [Enqueue] in a caller's own
// transaction notifies inside it, so the notification arrives exactly when
// the rows become visible. On the runtime's hot path (consumer handlers, the
// saga engine's starts, timeouts and operator actions) the notification is sent after the
// commit instead: a NOTIFY inside a transaction holds a cluster-wide lock
// through the commit's WAL flush, which stops concurrent transactions from
// sharing flushes (docs/benchmarks.md measures the cost).
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
)

// NotifyChannel is the PostgreSQL notification channel Enqueue signals.
const NotifyChannel = "saga_outbox"

// Enqueue writes envs to the outbox in tx, in order, with one statement, and
// makes sure relays are woken when tx commits. The rows carry the trace
// context of ctx when it has one (with a "create" span per message when its
// span is recording; see runtime/telemetry), the envelopes' own otherwise.
// Every envelope needs a message id, a message type and a schema version of
// at least 1; headers must be JSON-encodable (they are stored as jsonb). A
// message id already in the outbox is an error (unique violation): the
// message ids of different messages must differ.
//
// Called in the caller's own transaction, the statement also notifies relays
// (pg_notify, delivered at commit). Called from a handler the runtime runs
// (a consumer handler, a participant, the saga engine), it is cheaper: the
// insert is sent with the handler's other writes when the handler returns —
// its error then fails the handler's delivery — and the notification is sent
// after the consumer's commit, outside the transaction. On the consumer's
// fast path the rows of all the batch's handlers are inserted by one
// statement just before the commit (see the consumer's documentation); an
// error there sends the batch to the savepoint path, where it is the
// handler's again. Until then Enqueue keeps envs' bodies and headers: do not
// change them after it returns.
func Enqueue(ctx context.Context, tx pgx.Tx, envs ...message.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	rs, err := newRowset(envs)
	if err != nil {
		return fmt.Errorf("enqueue outbox messages: %w", err)
	}
	spans := traceRows(ctx, envs, rs.parents, rs.states)
	n, first := len(envs), rs.ids[0]
	result := func(_ pgconn.CommandTag, err error) error {
		endSpans(spans, err)
		if err == nil {
			return nil
		}
		if n == 1 {
			return fmt.Errorf("enqueue outbox message %s: %w", first, err)
		}
		return fmt.Errorf("enqueue %d outbox messages (first %s): %w", n, first, err)
	}
	if p, ok := txq.PartFor(tx, stagedKey{}, func() txq.Part { return &staged{} }); ok {
		// A consumer's fast path: the rows of all its handlers go out
		// as one insert before the commit (see txq.Stage).
		p.(*staged).add(rs, result)
		return nil
	}
	return write(ctx, tx, rs, result)
}

// write inserts rs in tx, or queues the insert in tx's scope, with
// the hand-off to a local relay or the relays' wake-up arranged.
func write(ctx context.Context, tx pgx.Tx, rs *rowset, result txq.Result) error {
	if r := relayOf(tx); r != nil && r.accepting() {
		// Hand the rows to the local relay after the commit, leased to it
		// from their insert, so no relay claims them (see relayOf). All
		// the rows of one commit go over together.
		if c, ok := txq.CollectorFor(tx, r, func() txq.Collector { return &handoff{r: r} }); ok {
			lr := &leasedRows{rows: make([]row, len(rs.envs))}
			for i := range lr.rows {
				e := &lr.rows[i].env
				*e = rs.envs[i]
				// As the database stores them, so that a handed-over copy
				// and a claimed one are the same message.
				e.Traceparent, e.Tracestate, e.Body = rs.parents[i], rs.states[i], rs.bodies[i]
				e.OccurredAt = rs.occurred[i].UTC().Truncate(time.Microsecond)
				e.Headers = r.decodeHeaders(0, e.MessageID, []byte(rs.headers[i]))
				lr.rows[i].attempts = 1
			}
			h := c.(*handoff)
			txq.AfterCommit(tx, func(context.Context) { h.add(lr) })
			return txq.Query(ctx, tx, lr.scan, result, insertLeasedSQL, append(rs.args(),
				r.cfg.Owner, r.cfg.LeaseDuration.Milliseconds())...)
		}
	}
	sql := insertSQL
	if !txq.Wake(tx, NotifyChannel) {
		sql = insertAndNotifySQL
	}
	return txq.Exec(ctx, tx, result, sql, rs.args()...)
}

// rowset is outbox rows as the insert statements take them: one array per
// column.
type rowset struct {
	envs                                                   []message.Envelope
	ids, exchanges, keys, types                            []string
	versions                                               []int32
	correlations, causations, sagaIDs, sagaTypes, idemKeys []string
	parents, states, headers                               []string
	bodies                                                 [][]byte
	occurred                                               []time.Time
}

// newRowset checks envs and encodes them as rows.
func newRowset(envs []message.Envelope) (*rowset, error) {
	n := len(envs)
	// The twelve text columns share one allocation; each column's capacity
	// ends at its own rows, so add reallocates rather than overwrite the
	// next column.
	text := make([]string, 12*n)
	col := func(i int) []string { return text[i*n : (i+1)*n : (i+1)*n] }
	rs := &rowset{
		envs: envs,
		ids:  col(0), exchanges: col(1), keys: col(2), types: col(3),
		versions:     make([]int32, n),
		correlations: col(4), causations: col(5), sagaIDs: col(6),
		sagaTypes: col(7), idemKeys: col(8),
		parents: col(9), states: col(10), headers: col(11),
		bodies:   make([][]byte, n),
		occurred: make([]time.Time, n),
	}
	var errs []error
	for i, e := range envs {
		switch {
		case e.MessageID == "":
			errs = append(errs, fmt.Errorf("envelope %d: empty message id", i))
		case e.MessageType == "":
			errs = append(errs, fmt.Errorf("message %s: empty message type", e.MessageID))
		case e.SchemaVersion < 1:
			errs = append(errs, fmt.Errorf("message %s: schema version %d, want at least 1", e.MessageID, e.SchemaVersion))
		default:
			if err := checkAMQP(&envs[i]); err != nil {
				errs = append(errs, fmt.Errorf("message %.60s: %w", e.MessageID, err))
			}
		}
		h := "{}"
		if len(e.Headers) > 0 {
			b, err := json.Marshal(e.Headers)
			if err != nil {
				errs = append(errs, fmt.Errorf("message %s: encode headers: %w", e.MessageID, err))
			}
			h = string(b)
		}
		body := e.Body
		if body == nil {
			body = []byte{}
		}
		at := e.OccurredAt
		if at.IsZero() {
			at = time.Now()
		}
		rs.ids[i], rs.exchanges[i], rs.keys[i], rs.types[i], rs.versions[i] = e.MessageID, e.Exchange, e.RoutingKey, e.MessageType, e.SchemaVersion
		rs.correlations[i], rs.causations[i], rs.sagaIDs[i], rs.sagaTypes[i] = e.CorrelationID, e.CausationID, e.SagaID, e.SagaType
		rs.idemKeys[i], rs.parents[i], rs.states[i] = e.IdempotencyKey, e.Traceparent, e.Tracestate
		rs.headers[i], rs.bodies[i], rs.occurred[i] = h, body, at
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rs, nil
}

// add appends o's rows after rs's.
func (rs *rowset) add(o *rowset) {
	rs.envs = append(rs.envs, o.envs...)
	rs.ids, rs.exchanges = append(rs.ids, o.ids...), append(rs.exchanges, o.exchanges...)
	rs.keys, rs.types = append(rs.keys, o.keys...), append(rs.types, o.types...)
	rs.versions = append(rs.versions, o.versions...)
	rs.correlations, rs.causations = append(rs.correlations, o.correlations...), append(rs.causations, o.causations...)
	rs.sagaIDs, rs.sagaTypes = append(rs.sagaIDs, o.sagaIDs...), append(rs.sagaTypes, o.sagaTypes...)
	rs.idemKeys, rs.parents = append(rs.idemKeys, o.idemKeys...), append(rs.parents, o.parents...)
	rs.states, rs.headers = append(rs.states, o.states...), append(rs.headers, o.headers...)
	rs.bodies, rs.occurred = append(rs.bodies, o.bodies...), append(rs.occurred, o.occurred...)
}

// args are the insert statements' first 15 parameters.
// The columns go as pointers, which pgx dereferences: boxing a slice into
// an interface would allocate for each.
func (rs *rowset) args() []any {
	return []any{&rs.ids, &rs.exchanges, &rs.keys, &rs.types, &rs.versions, &rs.correlations, &rs.causations,
		&rs.sagaIDs, &rs.sagaTypes, &rs.idemKeys, &rs.parents, &rs.states, &rs.headers, &rs.bodies, &rs.occurred}
}

// stagedKey names the outbox's part of a txq.Stage.
type stagedKey struct{}

// staged is the outbox rows a consumer's handlers enqueued in one fast-path
// transaction: one insert for all of them when the stage is flushed.
type staged struct {
	rows    rowset
	results []txq.Result
}

func (s *staged) add(rs *rowset, result txq.Result) {
	s.rows.add(rs)
	s.results = append(s.results, result)
}

func (s *staged) Queue(ctx context.Context, tx pgx.Tx) {
	results := txq.Results(s.results)
	// tx has the flush's scope: write queues and returns nil.
	_ = write(ctx, tx, &s.rows, func(tag pgconn.CommandTag, err error) error {
		if e := results(tag, err); e == nil || err == nil {
			return e // nothing failed, or a caller's own check did
		}
		// The server's error names the row; each Enqueue's own would
		// name its first message, not the culprit.
		return fmt.Errorf("insert the batch's %d outbox rows: %w", len(s.rows.ids), err)
	})
}

func (s *staged) Discard(err error) { _ = txq.Results(s.results)(pgconn.CommandTag{}, err) }

// insertSQL writes a batch of outbox rows, in order.
const insertSQL = `
INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version,
  correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
  headers, body, occurred_at)
SELECT m, x, k, t, v, co, ca, si, st, ik, tp, ts, h::jsonb, b, oa
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[], $7::text[],
  $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bytea[], $15::timestamptz[])
  WITH ORDINALITY AS u(m, x, k, t, v, co, ca, si, st, ik, tp, ts, h, b, oa, ord)
ORDER BY ord`

// insertLeasedSQL is insertSQL for rows handed to a local relay after the
// commit: they are born leased to it ($16, for $17 ms from the start of the
// transaction), as if claimed once. It returns each row's id and how many
// milliseconds of its lease are left.
const insertLeasedSQL = `
INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version,
  correlation_id, causation_id, saga_id, saga_type, idempotency_key, traceparent, tracestate,
  headers, body, occurred_at, lease_owner, lease_until, attempts)
SELECT m, x, k, t, v, co, ca, si, st, ik, tp, ts, h::jsonb, b, oa, $16, now() + $17 * interval '1 millisecond', 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[], $7::text[],
  $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bytea[], $15::timestamptz[])
  WITH ORDINALITY AS u(m, x, k, t, v, co, ca, si, st, ik, tp, ts, h, b, oa, ord)
ORDER BY ord
RETURNING id, message_id, (extract(epoch FROM lease_until - clock_timestamp()) * 1000)::bigint`

// insertAndNotifySQL is insertSQL that also notifies relays, delivered when
// the transaction commits.
const insertAndNotifySQL = `
WITH ins AS (` + insertSQL + `
)
SELECT pg_notify('` + NotifyChannel + `', '')`

// Publish wraps m in a new envelope (see message.New) and enqueues it in
// tx. It returns the message id.
func Publish(ctx context.Context, tx pgx.Tx, m message.Message, meta message.Meta) (messageID string, err error) {
	e, err := message.New(m, meta)
	if err != nil {
		return "", fmt.Errorf("publish: %w", err)
	}
	if err := Enqueue(ctx, tx, e); err != nil {
		return "", fmt.Errorf("publish %s: %w", e.MessageType, err)
	}
	return e.MessageID, nil
}

// checkAMQP refuses, at enqueue, what the relay could never publish: a
// name or property that does not fit an AMQP short string. Such a row would
// be claimed, fail and be released for ever.
func checkAMQP(e *message.Envelope) error {
	return broker.CheckEnvelope(e.Exchange, e.RoutingKey, e.MessageID, e.CorrelationID, e.MessageType, e.Headers)
}
