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
	"github.com/protosaga/saga/runtime/inbox"
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
// Once catches the same command resent as a new message (a step retried
// after a timeout keeps its idempotency key but gets a new message id).
// Inside a command run by [Idempotent], Once with the key Idempotent records
// the command under ([CommandKey], without an operator's retry) is not the
// first: the command's own record counts.
//
// Once needs the saga_participant_once table ([Migrations]).
func Once(ctx context.Context, tx pgx.Tx, service, idempotencyKey string) (first bool, err error) {
	if service == "" || idempotencyKey == "" {
		return false, retry.Permanent(fmt.Errorf("participant once: service %q and idempotency key %q must not be empty", service, idempotencyKey))
	}
	if r, ok := ctx.Value(onceRecordKey{}).(*onceRecord); ok && r.service == service && r.key == idempotencyKey {
		return false, nil
	}
	if b := batchOf(tx, service); b != nil {
		if row, known := b.rows[idempotencyKey]; known && row != nil {
			return false, nil
		}
	}
	tag, err := tx.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key)
VALUES ($1, $2) ON CONFLICT (service, idempotency_key) DO NOTHING`, service, idempotencyKey)
	if err != nil {
		return false, fmt.Errorf("participant once %s %q: %w", service, idempotencyKey, err)
	}
	first = tag.RowsAffected() == 1
	if b := batchOf(tx, service); b != nil {
		if _, known := b.rows[idempotencyKey]; known {
			b.rows[idempotencyKey] = &onceRow{key: idempotencyKey}
		}
	}
	return first, nil
}

// Idempotent wraps fn so that it runs once per command type and idempotency
// key for service, and a command resent with the same key gets the first reply
// again (decoded through reg) instead of a second effect. A redelivery of
// the very message that ran (same message id: a lost acknowledgement, a
// crash between commit and ack) has no effect and sends no reply, as the
// first run's reply is on its way already. An operator's retry after the
// step recorded a failure (message.HeaderOperatorRetry) is a new command to
// it: it runs fn again, once per retry. Commands without an idempotency key
// are refused as permanent failures: the contract must name one for every
// command.
//
// The record is scoped by the command's type ([CommandKey]): a reservation and
// its compensating release usually share a business key (the order id), and
// the release must not be answered with the reservation's stored reply.
//
// The record is written once, after fn returned, with the reply and the
// command's message id, in the same transaction as the effect (see the
// package doc for why that row is all the deduplication a participant
// needs).
func Idempotent(service string, reg *message.Registry, fn Func) Func {
	return func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		if cmd.IdempotencyKey() == "" {
			return nil, retry.Permanent(fmt.Errorf("participant %s: command %s has no idempotency key",
				service, cmd.SagaMessageInfo().FullName))
		}
		env, _ := Command(ctx)
		messageID := ""
		if env != nil {
			messageID = env.MessageID
		}
		key := onceKey(cmd, env)
		row, err := loadRecord(ctx, tx, service, key)
		if err != nil {
			return nil, err
		}
		ctx, rec := withOnceRecord(ctx)
		if row != nil {
			if messageID != "" && row.messageID == messageID {
				rec.deduped = true
				return nil, nil // this very message ran and committed: its reply went out then
			}
			if rec.unclaimed != "" && messageID != "" {
				// No record names this message: the inbox does, so that a
				// redelivery of it is not answered twice.
				first, err := inbox.Claim(ctx, tx, rec.unclaimed, messageID)
				if err != nil {
					return nil, fmt.Errorf("participant %s: key %q: %w", service, key, err)
				}
				rec.deduped = true
				if !first {
					return nil, nil
				}
			}
			return row.reply(service, reg)
		}
		if err := compensates(ctx, tx, service, env); err != nil {
			return nil, err
		}
		rec.service, rec.key = service, key
		reply, err := fn(ctx, tx, cmd)
		if err != nil && !errors.Is(err, ErrReplyLater) {
			return nil, err
		}
		row = &onceRow{key: key, messageID: messageID}
		if !isNil(reply) && err == nil {
			body, merr := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
			if merr != nil {
				return nil, fmt.Errorf("participant %s: encode reply for key %q: %w", service, key, merr)
			}
			row.replyType, row.replyBody = reply.SagaMessageInfo().FullName, body
		}
		if werr := writeRecord(ctx, tx, service, row); werr != nil {
			return nil, werr
		}
		rec.deduped = true
		if err != nil || isNil(reply) {
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
// compensation, then finds its record and has no effect and no reply.
//
// When the command is in the same consumer batch and has not run yet, the
// record is written with the batch's records. Otherwise it is written at
// once (not queued with the handler's writes): when the command is running
// in another transaction that wrote its record already, the insert waits
// for it to commit, and the compensation then sees its effect to undo;
// when that transaction writes its record only later (at the end of its
// batch), its insert finds this one and the command's transaction fails,
// rolling its effect back, and its retry finds the command compensated.
func compensates(ctx context.Context, tx pgx.Tx, service string, env *message.Envelope) error {
	if env == nil {
		return nil
	}
	key, ok, err := message.HeaderString(env.Headers, message.HeaderCompensates)
	if err != nil || !ok || key == "" {
		return nil // a malformed hint is not this command's failure: the compensation still runs
	}
	if b := batchOf(tx, service); b != nil {
		if row, known := b.rows[key]; known {
			if row == nil {
				b.add(&onceRow{key: key})
			}
			return nil
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO saga_participant_once (service, idempotency_key) VALUES ($1, $2)
ON CONFLICT (service, idempotency_key) DO NOTHING`, service, key); err != nil {
		return fmt.Errorf("participant %s: record %q as compensated before it ran: %w", service, key, err)
	}
	return nil
}

// onceRow is one saga_participant_once record: the command's key, the
// message id it ran as ("" for a record a compensation wrote before its
// command ran) and its first reply (replyType "" when it sent none).
type onceRow struct {
	key, messageID, replyType string
	replyBody                 []byte
}

// reply decodes the stored reply through reg; nil when the command sent
// none.
func (r *onceRow) reply(service string, reg *message.Registry) (message.Message, error) {
	if r.replyType == "" {
		return nil, nil // the first execution sent no reply
	}
	if reg == nil {
		return nil, retry.Permanent(fmt.Errorf("participant %s: cannot replay reply %s for key %q without a registry", service, r.replyType, r.key))
	}
	reply, err := reg.Decode(r.replyType, r.replyBody)
	if err != nil {
		return nil, retry.Permanent(fmt.Errorf("participant %s: replay reply for key %q: %w", service, r.key, err))
	}
	return reply, nil
}

// loadRecord returns the record of key for service, or nil when there is
// none: from the batch's read-ahead when the key is in it, else from the
// table.
func loadRecord(ctx context.Context, tx pgx.Tx, service, key string) (*onceRow, error) {
	if b := batchOf(tx, service); b != nil {
		if row, known := b.rows[key]; known {
			return row, nil
		}
	}
	// The record may still be queued in this handler's write scope (the
	// same command answered twice in one handler).
	if err := txq.Sync(ctx, tx); err != nil {
		return nil, err
	}
	row := &onceRow{key: key}
	err := tx.QueryRow(ctx, `SELECT message_id, reply_type, reply_body FROM saga_participant_once
WHERE service = $1 AND idempotency_key = $2`, service, key).Scan(&row.messageID, &row.replyType, &row.replyBody)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("participant %s: load once record for key %q: %w", service, key, err)
	}
	return row, nil
}

// writeRecord writes row, the record of a command that just ran: with the
// batch's records when the transaction is a consumer batch's (one
// statement for the batch, before the commit), else queued with the
// handler's writes, or at once outside a handler. A record of the same key
// that another transaction wrote meanwhile (the command ran there too, or
// its compensation recorded it) fails the write, and with it this
// transaction: the effect is rolled back, and the retry finds that record.
func writeRecord(ctx context.Context, tx pgx.Tx, service string, row *onceRow) error {
	part, ok := txq.PartFor(tx, batchKey{service}, func() txq.Part { return newOnceBatch(service) })
	if ok {
		part.(*onceBatch).add(row)
		return nil
	}
	return txq.Exec(ctx, tx, func(tag pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("participant %s: write once record for key %q: %w", service, row.key, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("participant %s: once record for key %q written by a concurrent transaction; this one rolls back", service, row.key)
		}
		return nil
	}, insertRecords, service, []string{row.key}, []string{row.messageID}, []string{row.replyType}, [][]byte{row.replyBody})
}

// insertRecords writes the records of service ($1) for the keys in $2 with
// their message ids, reply types and reply bodies ($3–$5), in key order.
const insertRecords = `INSERT INTO saga_participant_once (service, idempotency_key, message_id, reply_type, reply_body)
SELECT $1, k, m, t, b FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) AS r(k, m, t, b) ORDER BY k
ON CONFLICT (service, idempotency_key) DO NOTHING`

// On a consumer's fast path, BatchHandler reads the records of every command
// of the batch for its service in one statement, before any runs, and the
// records the batch's commands write are written by one statement when the
// batch's staged rows are written, before the commit. Both live in the
// batch's stage (txq.Stage), as one part per service.

// batchKey names a service's once records in a txq.Stage.
type batchKey struct{ service string }

// onceBatch is a batch's once records of one service.
type onceBatch struct {
	service string
	// rows holds the keys the batch knows: read ahead (nil: no record)
	// or written by the batch.
	rows map[string]*onceRow
	// write is the records to write at the flush, in the order written.
	write []*onceRow
}

func newOnceBatch(service string) *onceBatch {
	return &onceBatch{service: service, rows: map[string]*onceRow{}}
}

// batchOf returns tx's once records of service, or nil when tx carries no
// stage or none were read or written for service.
func batchOf(tx pgx.Tx, service string) *onceBatch {
	p, ok := txq.PartIf(tx, batchKey{service})
	if !ok {
		return nil
	}
	return p.(*onceBatch)
}

// add stages row for the flush; a later command of the batch with its key
// finds it.
func (b *onceBatch) add(row *onceRow) {
	b.rows[row.key] = row
	b.write = append(b.write, row)
}

// Queue writes the batch's records in one statement. Fewer rows written
// than staged means another transaction wrote one of the keys first: the
// batch fails as a whole and the consumer applies it again with a
// savepoint per delivery, where each command reads its record anew.
func (b *onceBatch) Queue(ctx context.Context, tx pgx.Tx) {
	if len(b.write) == 0 {
		return
	}
	rows := b.write
	b.write = nil
	keys := make([]string, len(rows))
	ids := make([]string, len(rows))
	types := make([]string, len(rows))
	bodies := make([][]byte, len(rows))
	for i, r := range rows {
		keys[i], ids[i], types[i], bodies[i] = r.key, r.messageID, r.replyType, r.replyBody
	}
	_ = txq.Exec(ctx, tx, func(tag pgconn.CommandTag, err error) error {
		if err != nil {
			return fmt.Errorf("participant once %s: write the batch's %d records (first key %q): %w", b.service, len(rows), keys[0], err)
		}
		if n := tag.RowsAffected(); n != int64(len(rows)) {
			return fmt.Errorf("participant once %s: wrote %d of the batch's %d records (first key %q): another transaction wrote the others first",
				b.service, n, len(rows), keys[0])
		}
		return nil
	}, insertRecords, b.service, keys, ids, types, bodies)
}

func (*onceBatch) Discard(error) {}

// BatchHandler returns the [consumer.BatchHandler] of service's consumer
// whose commands run fn, an [Idempotent] function (possibly under
// middleware): it reads the once records of every command of the batch for
// service in one statement and leaves them on the batch's transaction,
// where Idempotent finds them; then it runs [Handler](fn) for each delivery.
// The records the commands write go to the database in one statement with
// the batch's other staged rows. On a transaction that is not a consumer
// batch's, it reads nothing ahead. A failed read fails the batch as a whole
// ([consumer.FailBatch]).
//
// A consumer whose handler is BatchHandler over Idempotent itself (no
// middleware that could write without it) needs no inbox claim
// (consumer.Config.HandlerDedupes): the once record carries the message id.
func BatchHandler(service string, fn Func) consumer.BatchHandler {
	return &batchHandler{service: service, h: Handler(fn)}
}

type batchHandler struct {
	service string
	h       consumer.HandlerFunc
}

func (b *batchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, ds []*consumer.Delivery) []error {
	if err := readAhead(ctx, tx, b.service, ds); err != nil {
		return consumer.FailBatch(ds, err)
	}
	return b.h.HandleBatch(ctx, tx, ds)
}

// readAhead reads the records of ds's keys for BatchHandler.
func readAhead(ctx context.Context, tx pgx.Tx, service string, ds []*consumer.Delivery) error {
	var keys []string
	for _, d := range ds {
		if d.Message != nil && d.Message.IdempotencyKey() != "" {
			keys = append(keys, onceKey(d.Message, &d.Envelope))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	part, ok := txq.PartFor(tx, batchKey{service}, func() txq.Part { return newOnceBatch(service) })
	if !ok {
		return nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	// A key the table cannot take (say, one with a NUL byte) fails the
	// statement for the whole batch: the consumer then applies the batch
	// with a savepoint per delivery, where each command reads its own key
	// and only the bad one fails.
	rows, err := tx.Query(ctx, `SELECT idempotency_key, message_id, reply_type, reply_body FROM saga_participant_once
WHERE service = $1 AND idempotency_key = ANY($2::text[])`, service, keys)
	var found []*onceRow
	if err == nil {
		found, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*onceRow, error) {
			row := &onceRow{}
			return row, r.Scan(&row.key, &row.messageID, &row.replyType, &row.replyBody)
		})
	}
	if err != nil {
		return fmt.Errorf("participant once %s: read the batch's %d keys (first %q): %w", service, len(keys), keys[0], err)
	}
	b := part.(*onceBatch)
	for _, k := range keys {
		if _, known := b.rows[k]; !known {
			b.rows[k] = nil
		}
	}
	for _, row := range found {
		if b.rows[row.key] == nil { // a record the batch wrote already stays
			b.rows[row.key] = row
		}
	}
	return nil
}
