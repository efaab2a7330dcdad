package participant

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
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
		return false, failure.Permanent(fmt.Errorf("participant once: service %q and idempotency key %q must not be empty", service, idempotencyKey))
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
// again (decoded through reg) instead of a second effect. The first reply is
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
			return nil, failure.Permanent(fmt.Errorf("participant %s: command %s has no idempotency key",
				service, cmd.SagaMessageInfo().FullName))
		}
		key := CommandKey(cmd)
		first, err := Once(ctx, tx, service, key)
		if err != nil {
			return nil, err
		}
		if !first {
			return storedReply(ctx, tx, service, key, reg)
		}
		reply, err := fn(ctx, tx, cmd)
		if err != nil || reply == nil {
			return reply, err
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
// name and its idempotency key ("shop.inventory.v1.ReleaseInventory/o-42").
// Use it with [Once] for effects that must happen once per command.
func CommandKey(cmd message.Message) string {
	return cmd.SagaMessageInfo().FullName + "/" + cmd.IdempotencyKey()
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
		return nil, failure.Permanent(fmt.Errorf("participant %s: cannot replay reply %s for key %q without a registry", service, typ, key))
	}
	reply, err := reg.Decode(typ, body)
	if err != nil {
		return nil, failure.Permanent(fmt.Errorf("participant %s: replay reply for key %q: %w", service, key, err))
	}
	return reply, nil
}
