package participant

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
)

// Once records that service applied the effect keyed by idempotencyKey, in
// the caller's transaction, and reports whether this is the first time.
// Apply the effect only when first is true. Because the record is written in
// the same transaction as the effect, a rollback forgets both; a concurrent
// transaction with the same key waits for this one and then sees first=false.
//
// The consumer's inbox already drops redeliveries of one message; Once
// catches the same command resent as a new message (a step retried after a
// timeout keeps its idempotency key but gets a new message id).
//
// Once needs the saga_participant_once table ([Migrations]).
func Once(ctx context.Context, tx pgx.Tx, service, idempotencyKey string) (first bool, err error) {
	if service == "" || idempotencyKey == "" {
		return false, retry.Permanent(fmt.Errorf("participant once: service %q and idempotency key %q must not be empty", service, idempotencyKey))
	}
	if p, ok := txq.PartIf(tx, aheadKey{service}); ok {
		if first, ok := p.(*claimedAhead).take(idempotencyKey); ok {
			return first, nil
		}
	}
	tag, err := tx.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key)
VALUES ($1, $2) ON CONFLICT (service, idempotency_key) DO NOTHING`, service, idempotencyKey)
	if err != nil {
		return false, fmt.Errorf("participant once %s %q: %w", service, idempotencyKey, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Idempotent wraps fn so that it runs once per command type and idempotency
// key for service, and a command resent with the same key gets the first reply
// again (decoded through reg) instead of a second effect. An operator's retry
// after the step recorded a failure (message.HeaderOperatorRetry) is a new
// command to it: it runs fn again, once per retry. The first reply is
// stored in the same transaction as the effect. Commands without an
// idempotency key are refused as permanent failures: the contract must name
// one for every command.
//
// The record is scoped by the command's type ([CommandKey]): a reservation and
// its compensating release usually share a business key (the order id), and
// the release must not be answered with the reservation's stored reply.
func Idempotent(service string, reg *message.Registry, fn Func) Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		if cmd.IdempotencyKey() == "" {
			return nil, retry.Permanent(fmt.Errorf("participant %s: command %s has no idempotency key",
				service, cmd.SagaMessageInfo().FullName))
		}
		env, _ := Command(ctx)
		key := onceKey(cmd, env)
		first, err := Once(ctx, tx, service, key)
		if err != nil {
			return nil, err
		}
		if !first {
			return storedReply(ctx, tx, service, key, reg)
		}
		if err := compensates(ctx, tx, service, env); err != nil {
			return nil, err
		}
		ctx, rec := withOnceRecord(ctx)
		*rec = onceRecord{service: service, key: key}
		reply, err := fn(ctx, tx, cmd)
		if err != nil || isNil(reply) {
			return nil, err
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
		if err != nil {
			return nil, fmt.Errorf("participant %s: encode reply for key %q: %w", service, key, err)
		}
		// Sent with the reply's outbox row when a consumer runs the
		// handler (one round trip for both), at once otherwise.
		err = txq.Exec(ctx, tx, func(_ pgconn.CommandTag, err error) error {
			if err != nil {
				return fmt.Errorf("participant %s: store reply for key %q: %w", service, key, err)
			}
			return nil
		}, `UPDATE saga_participant_once SET reply_type = $3, reply_body = $4
WHERE service = $1 AND idempotency_key = $2`, service, key, reply.SagaMessageInfo().FullName, body)
		if err != nil {
			return nil, err
		}
		return reply, nil
	}
}

// CommandKey is the key [Idempotent] records a command under: its type's full
// name and its idempotency key ("shop.inventory.v1.ReleaseInventory/o-42",
// message.OnceKey). Use it with [Once] for effects that must happen once per
// command; unlike [Idempotent], such effects are not run again for an
// operator's retry after a recorded failure (Idempotent records CommandKey
// plus "#operator-retry-N" for such a command).
func CommandKey(cmd message.Message) string { return message.OnceKey(cmd, 0) }

// onceKey is the key [Idempotent] records cmd under: message.OnceKey with the
// operator retry count env carries (message.HeaderOperatorRetry). The retry
// then runs the command again instead of answering with the failure stored
// for the first try, and the retry's own resends (after a timeout) share its
// key.
func onceKey(cmd message.Message, env *message.Envelope) string {
	n := 0
	if env != nil {
		if v, ok, err := message.HeaderInt(env.Headers, message.HeaderOperatorRetry); ok && err == nil && v > 0 {
			n = int(v)
		}
	}
	return message.OnceKey(cmd, n)
}

// compensates records, for a compensating command that names the command it
// undoes (message.HeaderCompensates), that command's key as done for
// service, unless it ran already: the command, arriving after its
// compensation, then finds its record and has no effect and no reply. The
// record is written before the compensation runs, at once (not queued with
// the handler's writes): when the command is running in another transaction
// right now, the insert waits for it to commit, and the compensation then
// sees its effect to undo.
func compensates(ctx context.Context, tx pgx.Tx, service string, env *message.Envelope) error {
	if env == nil {
		return nil
	}
	key, ok, err := message.HeaderString(env.Headers, message.HeaderCompensates)
	if err != nil || !ok || key == "" {
		return nil // a malformed hint is not this command's failure: the compensation still runs
	}
	if p, ok := txq.PartIf(tx, aheadKey{service}); ok {
		if p.(*claimedAhead).settle(key) {
			return nil
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key) VALUES ($1, $2)
ON CONFLICT (service, idempotency_key) DO NOTHING`, service, key); err != nil {
		return fmt.Errorf("participant %s: record %q as compensated before it ran: %w", service, key, err)
	}
	return nil
}

func storedReply(ctx context.Context, tx pgx.Tx, service, key string, reg *message.Registry) (message.Message, error) {
	// The first reply may still be queued in this handler's write scope
	// (the same command answered twice in one handler).
	if err := txq.Sync(ctx, tx); err != nil {
		return nil, err
	}
	var typ string
	var body []byte
	err := tx.QueryRow(ctx, `SELECT reply_type, reply_body FROM saga_participant_once
WHERE service = $1 AND idempotency_key = $2`, service, key).Scan(&typ, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("participant %s: once record for key %q vanished", service, key)
	}
	if err != nil {
		return nil, fmt.Errorf("participant %s: load reply for key %q: %w", service, key, err)
	}
	if typ == "" {
		return nil, nil // the first execution sent no reply
	}
	if reg == nil {
		return nil, retry.Permanent(fmt.Errorf("participant %s: cannot replay reply %s for key %q without a registry", service, typ, key))
	}
	reply, err := reg.Decode(typ, body)
	if err != nil {
		return nil, retry.Permanent(fmt.Errorf("participant %s: replay reply for key %q: %w", service, key, err))
	}
	return reply, nil
}

// On a consumer's fast path BatchHandler records the keys of every command in
// the batch for its service at once, in one statement, instead of one
// statement per command. Once then takes a key from that claim. When the batch's staged rows are written, the records no
// call took (commands another handler of the batch ran) are deleted again,
// so the transaction commits the records it would have written one by one.

// aheadKey names a service's records claimed ahead in a txq.Stage.
type aheadKey struct{ service string }

// claimedAhead is the records a batch claimed ahead for one service.
type claimedAhead struct {
	service string
	first   map[string]bool // per key claimed: whether the claim inserted it
	taken   map[string]bool // keys Once has answered for
}

// settle makes a key the batch claimed ahead count as done, for a
// compensation that overtook its command within the batch: the claim's
// record stays (it is the command's record now) and the command's Once
// answers "not the first". It reports whether the claim holds key.
func (c *claimedAhead) settle(key string) bool {
	if _, claimed := c.first[key]; !claimed {
		return false
	}
	c.taken[key] = true
	return true
}

// take answers Once for key from the claim: ok is false when key was not
// claimed. A key's second Once in the batch is not the first.
func (c *claimedAhead) take(key string) (first, ok bool) {
	inserted, claimed := c.first[key]
	if !claimed {
		return false, false
	}
	if c.taken[key] {
		return false, true
	}
	c.taken[key] = true
	return inserted, true
}

// BatchHandler returns the [consumer.BatchHandler] of service's consumer
// whose commands run fn, an [Idempotent] function (possibly under
// middleware): it records the keys of every command of the batch for
// service in one statement, in key order (so that two batches claiming the
// same keys wait for each other rather than deadlock), and leaves the claim
// on the batch's transaction, where [Once] takes its keys from it; then it
// runs [Handler](fn) for each delivery. With fewer than two keys, or on a
// transaction that is not a consumer batch's, it claims nothing ahead. A
// failed claim statement fails the batch as a whole ([consumer.FailBatch]).
func BatchHandler(service string, fn Func) consumer.BatchHandler {
	return &batchHandler{service: service, h: Handler(fn)}
}

type batchHandler struct {
	service string
	h       consumer.HandlerFunc
}

func (b *batchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
	if err := claimAhead(ctx, tx, b.service, ds); err != nil {
		return consumer.FailBatch(ds, err)
	}
	return b.h.HandleBatch(ctx, tx, ds)
}

// claimAhead claims the keys of ds for BatchHandler.
func claimAhead(ctx context.Context, tx pgx.Tx, service string, ds []*consumer.Delivery) error {
	var keys []string
	for _, d := range ds {
		if d.Message != nil && d.Message.IdempotencyKey() != "" {
			keys = append(keys, onceKey(d.Message, &d.Envelope))
		}
	}
	if len(keys) < 2 {
		return nil
	}
	part, ok := txq.PartFor(tx, aheadKey{service}, func() txq.Part {
		return &claimedAhead{service: service, first: map[string]bool{}, taken: map[string]bool{}}
	})
	if !ok {
		return nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	// A key the table cannot take (say, one with a NUL byte) fails the
	// statement for the whole batch: the consumer then applies the batch
	// with a savepoint per delivery, where each command claims its own key
	// and only the bad one fails.
	rows, err := tx.Query(ctx, `INSERT INTO saga_participant_once (service, idempotency_key)
SELECT $1, k FROM unnest($2::text[]) AS k ORDER BY k
ON CONFLICT (service, idempotency_key) DO NOTHING
RETURNING idempotency_key`, service, keys)
	var inserted []string
	if err == nil {
		inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("participant once %s: claim the batch's %d keys: %w", service, len(keys), err)
	}
	c := part.(*claimedAhead)
	for _, k := range keys {
		c.first[k] = false
	}
	for _, k := range inserted {
		c.first[k] = true
	}
	return nil
}

// Queue deletes the records the claim inserted and no Once took.
func (c *claimedAhead) Queue(ctx context.Context, tx pgx.Tx) {
	var unused []string
	for k, inserted := range c.first {
		if inserted && !c.taken[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) == 0 {
		return
	}
	_ = txq.Exec(ctx, tx, func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("participant once %s: drop %d keys claimed ahead and not used: %w", c.service, len(unused), err)
		}
		return nil
	}, `DELETE FROM saga_participant_once WHERE service = $1 AND idempotency_key = ANY($2::text[])`, c.service, unused)
}

func (*claimedAhead) Discard(error) {}
