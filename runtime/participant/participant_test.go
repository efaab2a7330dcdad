package participant_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	sagaoutbox "github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagatest"
	"github.com/protosaga/saga/runtime/schema"
)

// newInfo is a test message type (sagatest.Message); the value is the
// order id, and its idempotency key, like generated code's, the business
// key alone.
func newInfo(name string, kind message.Kind, exchange, key string) *message.Info {
	return sagatest.Type{FullName: "test.inventory.v1." + name, Kind: kind, Exchange: exchange, RoutingKey: key,
		IdempotencyKey: func(order string) string { return order }}.Info()
}

var (
	reserveInfo  = newInfo("ReserveInventory", message.KindCommand, "test.commands", "inventory.reserve")
	releaseInfo  = newInfo("ReleaseInventory", message.KindCommand, "test.commands", "inventory.release")
	releasedInfo = newInfo("InventoryReleased", message.KindReply, "test.replies", "order.inventory-released")
	reservedInfo = newInfo("InventoryReserved", message.KindReply, "test.replies", "order.inventory-reserved")
	failedInfo   = newInfo("InventoryFailed", message.KindReply, "test.replies", "order.inventory-failed")
)

func registry(t *testing.T) *message.Registry {
	t.Helper()
	reg, err := message.NewRegistry(reserveInfo, reservedInfo, failedInfo, releaseInfo, releasedInfo)
	require.NoError(t, err)
	return reg
}

func msg(in *message.Info, order string) *sagatest.Message {
	return sagatest.NewMessage(in, order)
}

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t)
	require.NoError(t, schema.Migrate(context.Background(), pool, participant.Migrations))
	return pool
}

// reserving is an idempotent inventory participant that answers every
// command with InventoryReserved.
func reserving(t *testing.T) participant.Func {
	t.Helper()
	return participant.Idempotent("inventory", registry(t),
		func(_ context.Context, _ pgx.Tx, cmd message.Message) (message.Message, error) {
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		})
}

// command returns a delivery of a ReserveInventory command sent by a saga.
func command(t *testing.T, order string) *consumer.Delivery {
	t.Helper()
	sagaID := uuid.NewString()
	m := msg(reserveInfo, order)
	env, err := message.New(m, message.Meta{
		SagaID: sagaID, SagaType: "test.order.v1.PlaceOrder", CorrelationID: sagaID,
		CausationID: uuid.NewString(),
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "vendor=x",
	})
	require.NoError(t, err)
	return &consumer.Delivery{Envelope: env, Message: m, Queue: "inventory.commands", Attempt: 1}
}

func run(ctx context.Context, pool *pgxpool.Pool, h consumer.HandlerFunc, d *consumer.Delivery) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return h(ctx, tx, d) })
}

type outboxRow struct {
	MessageID, MessageType, Exchange, RoutingKey, CorrelationID, CausationID, SagaID, SagaType, Traceparent, Tracestate string
	Body                                                                                                                []byte
}

func outbox(t *testing.T, pool *pgxpool.Pool) []outboxRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id, message_type, exchange, routing_key, correlation_id,
	causation_id, saga_id, saga_type, traceparent, tracestate, body FROM saga_outbox ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	require.NoError(t, err)
	return out
}

func TestHandlerWritesReplyInSameTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()

	// The business effect: a row in the participant's own table.
	_, err := pool.Exec(ctx, `CREATE TABLE reservations (order_id text PRIMARY KEY)`)
	require.NoError(t, err)
	h := participant.Handler(func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		order := cmd.(*sagatest.Message).GetValue()
		if order == "sold-out" {
			return msg(failedInfo, order), nil // a business failure is a reply
		}
		if order == "broken" {
			return nil, errors.New("inventory database on fire")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO reservations VALUES ($1)`, order); err != nil {
			return nil, err
		}
		return msg(reservedInfo, order), nil
	})

	d := command(t, "order-1")
	require.NoError(t, run(ctx, pool, h, d))
	rows := outbox(t, pool)
	require.Len(t, rows, 1)
	r := rows[0]
	require.Equal(t, reservedInfo.FullName, r.MessageType)
	require.Equal(t, "test.replies", r.Exchange)
	require.Equal(t, "order.inventory-reserved", r.RoutingKey)
	require.Equal(t, d.Envelope.MessageID, r.CausationID, "a reply is caused by its command")
	require.Equal(t, d.Envelope.SagaID, r.SagaID)
	require.Equal(t, d.Envelope.CorrelationID, r.CorrelationID)
	require.Equal(t, d.Envelope.SagaType, r.SagaType)
	require.Equal(t, d.Envelope.Traceparent, r.Traceparent)
	require.Equal(t, d.Envelope.Tracestate, r.Tracestate)
	require.NotEqual(t, d.Envelope.MessageID, r.MessageID)
	got, err := registry(t).Decode(r.MessageType, r.Body)
	require.NoError(t, err)
	require.Equal(t, "order-1", got.CorrelationKey())

	// A business failure is a reply, not an error.
	d = command(t, "sold-out")
	require.NoError(t, run(ctx, pool, h, d))
	rows = outbox(t, pool)
	require.Len(t, rows, 2)
	require.Equal(t, failedInfo.FullName, rows[1].MessageType)
	require.Equal(t, d.Envelope.MessageID, rows[1].CausationID)

	// An error rolls back: no effect, no reply; the consumer routes the
	// failure.
	err = run(ctx, pool, h, command(t, "broken"))
	require.ErrorContains(t, err, "inventory database on fire")
	require.Len(t, outbox(t, pool), 2)

	// A reply that cannot be enveloped fails the delivery, and the effect
	// rolls back with it.
	bad := participant.Handler(func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO reservations VALUES ('bad-reply')`); err != nil {
			return nil, err
		}
		return sagatest.NewMessage(&message.Info{FullName: "test.NoVersion"}, "x"), nil
	})
	require.Error(t, run(ctx, pool, bad, command(t, "bad-reply")))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = 'bad-reply'`).Scan(&n))
	require.Zero(t, n)

	// No reply, no row.
	none := participant.Handler(func(context.Context, pgx.Tx, message.Message) (message.Message, error) { return nil, nil })
	require.NoError(t, run(ctx, pool, none, command(t, "order-2")))
	require.Len(t, outbox(t, pool), 2)

	require.Equal(t, retry.ClassPermanent, retry.ClassOf(run(ctx, pool, h, &consumer.Delivery{})))
}

func TestOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()

	once := func(key string) (bool, error) {
		var first bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			first, err = participant.Once(ctx, tx, "inventory", key)
			return err
		})
		return first, err
	}
	first, err := once("k1")
	require.NoError(t, err)
	require.True(t, first)
	first, err = once("k1")
	require.NoError(t, err)
	require.False(t, first)

	// Keys are per service.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		first, err := participant.Once(ctx, tx, "payments", "k1")
		require.True(t, first)
		return err
	}))

	// A rolled-back transaction forgets the key along with the effect.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		first, err := participant.Once(ctx, tx, "inventory", "k2")
		require.NoError(t, err)
		require.True(t, first)
		return errors.New("effect failed")
	})
	require.Error(t, err)
	first, err = once("k2")
	require.NoError(t, err)
	require.True(t, first)

	// Concurrent transactions with one key: exactly one is first.
	const n = 8
	var firsts atomic.Int32
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			f, err := once("k3")
			errs[i] = err
			if f {
				firsts.Add(1)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), firsts.Load())

	_, err = once("")
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))
}

// TestIdempotentResentCommand resends one command with a new message id (a
// saga retrying a step after a timeout): the effect happens once and both
// deliveries get the same reply, each caused by its own command.
func TestIdempotentResentCommand(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	reg := registry(t)

	var calls atomic.Int32
	h := participant.Handler(participant.Idempotent("inventory", reg,
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			calls.Add(1)
			order := cmd.(*sagatest.Message).GetValue()
			if strings.HasPrefix(order, "fail") {
				return nil, fmt.Errorf("transient trouble for %s", order)
			}
			return msg(reservedInfo, order), nil
		}))

	first := command(t, "order-1")
	second := command(t, "order-1") // same idempotency key, new message id
	require.Equal(t, first.Envelope.IdempotencyKey, second.Envelope.IdempotencyKey)
	require.NotEqual(t, first.Envelope.MessageID, second.Envelope.MessageID)
	require.NoError(t, run(ctx, pool, h, first))
	require.NoError(t, run(ctx, pool, h, second))
	require.Equal(t, int32(1), calls.Load(), "the effect ran once")

	rows := outbox(t, pool)
	require.Len(t, rows, 2)
	require.Equal(t, first.Envelope.MessageID, rows[0].CausationID)
	require.Equal(t, second.Envelope.MessageID, rows[1].CausationID)
	require.Equal(t, rows[0].MessageType, rows[1].MessageType)
	require.Equal(t, rows[0].Body, rows[1].Body, "the first reply is replayed")

	// A failed first attempt leaves no record: the retry runs the effect.
	require.Error(t, run(ctx, pool, h, command(t, "fail-1")))
	require.Error(t, run(ctx, pool, h, command(t, "fail-1")))
	require.Equal(t, int32(3), calls.Load())
}

// TestIdempotentRunsAnOperatorRetryAgain: a command an operator retried
// after its step recorded a business failure (message.HeaderOperatorRetry)
// runs the effect again instead of replaying the stored failure; resends of
// that retry replay its own reply, and a second retry runs again.
func TestIdempotentRunsAnOperatorRetryAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	reg := registry(t)

	var calls atomic.Int32
	h := participant.Handler(participant.Idempotent("inventory", reg,
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			if calls.Add(1) == 1 {
				return msg(failedInfo, cmd.(*sagatest.Message).GetValue()), nil // out of stock
			}
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		}))
	retry := func(n any) *consumer.Delivery {
		d := command(t, "order-7")
		if n != nil {
			d.Envelope.Headers = map[string]any{message.HeaderOperatorRetry: n}
		}
		return d
	}
	replies := func() []string {
		var types []string
		for _, r := range outbox(t, pool) {
			types = append(types, r.MessageType)
		}
		return types
	}

	require.NoError(t, run(ctx, pool, h, retry(nil)))
	require.NoError(t, run(ctx, pool, h, retry(nil)), "a resend of the first try")
	require.Equal(t, int32(1), calls.Load())
	require.NoError(t, run(ctx, pool, h, retry(int32(1))), "the operator's retry")
	require.Equal(t, int32(2), calls.Load(), "the retry ran the effect again")
	require.NoError(t, run(ctx, pool, h, retry(int64(1))), "a resend of the retry (any integer encoding)")
	require.Equal(t, int32(2), calls.Load())
	require.NoError(t, run(ctx, pool, h, retry(2)), "a second retry")
	require.Equal(t, int32(3), calls.Load())
	f, r := failedInfo.FullName, reservedInfo.FullName
	require.Equal(t, []string{f, f, r, r, r}, replies())
}

// TestIdempotentReplaysWithinOneWriteScope answers one command twice inside
// one handler run by a consumer, whose write scope holds the first reply's
// stored copy back until the handler returns: the second answer must still
// replay it (the scope is synced before the stored reply is read).
func TestIdempotentReplaysWithinOneWriteScope(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	fn := reserving(t)
	d := command(t, "order-7")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		stx, scope := txq.WithScope(tx)
		first, err := fn(ctx, stx, d.Message)
		require.NoError(t, err)
		require.Positive(t, scope.Len(), "the stored reply is queued, not yet sent")
		again, err := fn(ctx, stx, d.Message)
		require.NoError(t, err)
		require.NotNil(t, again, "the queued first reply is replayed")
		require.Equal(t, first.SagaMessageInfo().FullName, again.SagaMessageInfo().FullName)
		require.Equal(t, "order-7", again.(*sagatest.Message).GetValue())
		return scope.Flush(ctx)
	}))
}

// TestDefer: inside a handler's write scope the statement waits for the
// flush and its error carries the description; elsewhere it runs at once.
func TestDefer(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE journal (id int PRIMARY KEY)`)
	require.NoError(t, err)
	rows := func(tx pgx.Tx) (n int) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM journal`).Scan(&n))
		return n
	}
	require.Error(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, participant.Defer(ctx, tx, "journal 1", `INSERT INTO journal VALUES (1)`))
		require.Equal(t, 1, rows(tx), "without a scope the write runs at once")

		stx, scope := txq.WithScope(tx)
		require.NoError(t, participant.Defer(ctx, stx, "journal 2", `INSERT INTO journal VALUES (2)`))
		require.NoError(t, participant.Defer(ctx, stx, "journal 1 again", `INSERT INTO journal VALUES (1)`))
		require.Equal(t, 1, rows(tx), "queued until the scope is flushed")
		err := scope.Flush(ctx)
		require.ErrorContains(t, err, "journal 1 again: ")
		require.ErrorContains(t, err, "23505")
		return err
	}))
}

// TestIdempotentScopesByCommandType: a reservation and its compensating
// release share the business key (the order id); the release must run its own
// effect and answer with its own reply, not the reservation's stored one.
func TestIdempotentScopesByCommandType(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	reg := registry(t)

	var effects []string
	h := participant.Handler(participant.Idempotent("inventory", reg,
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			name := cmd.SagaMessageInfo().FullName
			effects = append(effects, name)
			if name == releaseInfo.FullName {
				return msg(releasedInfo, cmd.(*sagatest.Message).GetValue()), nil
			}
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		}))

	reserve := command(t, "order-7")
	release := command(t, "order-7")
	release.Message = msg(releaseInfo, "order-7")
	require.Equal(t, reserve.Message.IdempotencyKey(), release.Message.IdempotencyKey(), "same business key")
	require.NoError(t, run(ctx, pool, h, reserve))
	require.NoError(t, run(ctx, pool, h, release))
	resent := command(t, "order-7") // the release resent as a new message: no second effect
	resent.Message = release.Message
	require.NoError(t, run(ctx, pool, h, resent))

	require.Equal(t, []string{reserveInfo.FullName, releaseInfo.FullName}, effects)
	rows := outbox(t, pool)
	require.Len(t, rows, 3)
	require.Equal(t, reservedInfo.FullName, rows[0].MessageType)
	require.Equal(t, releasedInfo.FullName, rows[1].MessageType)
	require.Equal(t, releasedInfo.FullName, rows[2].MessageType, "the resent release gets the release's stored reply")
	require.Equal(t, "test.inventory.v1.ReleaseInventory/order-7", participant.CommandKey(release.Message))
}

// TestReplyLater: a participant commits its effect, sends nothing now, and
// answers later in another transaction from the command envelope it kept.
func TestReplyLater(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()

	var kept *message.Envelope
	h := participant.Handler(func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
		env, ok := participant.Command(ctx)
		require.True(t, ok, "the command's envelope is in the handler's context")
		kept = env
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS later_effects (order_id text)`); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO later_effects VALUES ($1)`, cmd.(*sagatest.Message).GetValue()); err != nil {
			return nil, err
		}
		return nil, participant.ErrReplyLater
	})
	cmd := command(t, "order-9")
	require.NoError(t, run(ctx, pool, h, cmd), "replying later is not a failure")
	require.Empty(t, outbox(t, pool), "nothing is sent now")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM later_effects`).Scan(&n))
	require.Equal(t, 1, n, "the effect committed")

	_, ok := participant.Command(ctx)
	require.False(t, ok, "no command outside a handler")
	require.Equal(t, cmd.Envelope.MessageID, kept.MessageID)
	env, err := participant.ReplyEnvelope(kept, msg(reservedInfo, "order-9"))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return sagaoutbox.Enqueue(ctx, tx, env) }))
	rows := outbox(t, pool)
	require.Len(t, rows, 1)
	require.Equal(t, cmd.Envelope.MessageID, rows[0].CausationID, "the later reply answers the command")
	require.Equal(t, cmd.Envelope.SagaID, rows[0].SagaID)
}

// TestReplyAdapters: the typed dispatch's adapters pass replies and errors
// through, refuse a nil reply (permanent) unless the command declares none.
func TestReplyAdapters(t *testing.T) {
	t.Parallel()
	r := msg(reservedInfo, "o-1")
	got, err := participant.Reply(r, nil)
	require.NoError(t, err)
	require.Equal(t, r, got)
	boom := errors.New("database down")
	_, err = participant.Reply(r, boom)
	require.ErrorIs(t, err, boom)
	_, err = participant.Reply[message.Message](nil, nil)
	require.Equal(t, retry.ClassPermanent, retry.ClassOf(err))
	_, err = participant.Reply[message.Message](nil, participant.ErrReplyLater)
	require.ErrorIs(t, err, participant.ErrReplyLater)

	got, err = participant.NoReply[message.Message](nil, nil)
	require.NoError(t, err)
	require.Nil(t, got)
	got, err = participant.NoReply(r, nil)
	require.NoError(t, err)
	require.Equal(t, r, got)
}

// TestIdempotentReadsTheBatchAhead: on a consumer's fast path (a stage)
// BatchHandler reads the once records of every command in the batch with one
// statement; each command's Idempotent call finds its key there (a resend
// in the same batch gets the first reply, a redelivery of a message that
// ran gets nothing), and the records the batch's commands write are written
// by one statement when the stage is written, each once, with its reply and
// message id: no record is updated afterwards.
func TestIdempotentReadsTheBatchAhead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE once_writes (op text NOT NULL);
CREATE FUNCTION count_once_write() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO once_writes VALUES (TG_OP); RETURN NULL; END $$;
CREATE TRIGGER count_once_write AFTER INSERT OR UPDATE OR DELETE ON saga_participant_once
  FOR EACH STATEMENT EXECUTE FUNCTION count_once_write();`)
	require.NoError(t, err)
	// order-0 was handled in an earlier batch.
	require.NoError(t, run(ctx, pool, participant.Handler(reserving(t)), command(t, "order-0")))

	var effects []string
	fn := participant.Idempotent("inventory", registry(t),
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			effects = append(effects, cmd.(*sagatest.Message).GetValue())
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		})
	first := command(t, "order-1")
	batch := []*consumer.Delivery{first, command(t, "order-2"), command(t, "order-1"),
		command(t, "order-0"), first, command(t, "order-3")}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	wakes := txq.NewWakes(tx)
	stage := txq.NewStage(tx, wakes)
	btx := txq.New(tx, wakes, stage)
	keys := func() []string {
		t.Helper()
		rows, err := tx.Query(ctx, `SELECT idempotency_key FROM saga_participant_once ORDER BY 1`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	key := func(order string) string { return reserveInfo.FullName + "/" + order }
	require.NoError(t, participant.ReadAhead(ctx, btx, "inventory", batch))
	var replies []string
	for i, d := range batch[:5] { // order-3 is left to another handler, which fails to run it
		stx, scope := txq.WithScope(btx)
		reply, err := fn(participant.WithCommand(ctx, &d.Envelope), stx, d.Message)
		require.NoError(t, err, "command %d", i)
		require.NoError(t, scope.Flush(ctx))
		if reply == nil {
			replies = append(replies, "none")
			continue
		}
		replies = append(replies, reply.(*sagatest.Message).GetValue())
	}
	require.Equal(t, []string{"order-1", "order-2"}, effects, "each effect once; order-0's was earlier")
	require.Equal(t, []string{"order-1", "order-2", "order-1", "order-0", "none"}, replies,
		"resends get the first reply; the redelivered first message gets none")
	require.Equal(t, []string{key("order-0")}, keys(), "the batch's records wait for the stage")
	require.NoError(t, stage.Flush(ctx))
	require.Equal(t, []string{key("order-0"), key("order-1"), key("order-2")}, keys(),
		"order-3 never ran: no record")
	require.NoError(t, tx.Commit(ctx))
	var messageID, replyType string
	require.NoError(t, pool.QueryRow(ctx, `SELECT message_id, reply_type FROM saga_participant_once WHERE idempotency_key = $1`,
		key("order-1")).Scan(&messageID, &replyType))
	require.Equal(t, first.Envelope.MessageID, messageID, "the record names the message the command ran as")
	require.Equal(t, reservedInfo.FullName, replyType)
	rows, err := pool.Query(ctx, `SELECT op FROM once_writes`)
	require.NoError(t, err)
	ops, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"INSERT", "INSERT"}, ops, "order-0's handler, then one statement for this batch; no UPDATE")
}

// TestIdempotentDropsARedelivery: the very message delivered again after
// its transaction committed (a lost acknowledgement) has no second effect
// and sends no second reply, without any inbox claim; a resend of the
// command as a new message gets the first reply.
func TestIdempotentDropsARedelivery(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	effects := 0
	h := participant.Handler(participant.Idempotent("inventory", registry(t),
		func(_ context.Context, _ pgx.Tx, cmd message.Message) (message.Message, error) {
			effects++
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		}))
	d := command(t, "order-5")
	require.NoError(t, run(ctx, pool, h, d))
	require.NoError(t, run(ctx, pool, h, d))
	require.Equal(t, 1, effects)
	require.Len(t, outbox(t, pool), 1, "the redelivery sends no reply")
	resend := command(t, "order-5")
	require.NoError(t, run(ctx, pool, h, resend))
	require.Equal(t, 1, effects)
	out := outbox(t, pool)
	require.Len(t, out, 2, "the resend gets the first reply again")
	require.Equal(t, resend.Envelope.MessageID, out[1].CausationID)
}

// TestUnclaimedReplayClaimsTheInbox: under a consumer that claims nothing
// in the inbox, a resend answered from the once record (it writes no record
// of its own) claims its message id there, so its redelivery is dropped
// instead of answered again; a command that runs claims nothing.
func TestUnclaimedReplayClaimsTheInbox(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	h := participant.Handler(reserving(t))
	unclaimed := func(d *consumer.Delivery) *consumer.Delivery {
		d.Unclaimed = "inventory.commands"
		return d
	}
	first := unclaimed(command(t, "order-6"))
	require.NoError(t, run(ctx, pool, h, first))
	resend := unclaimed(command(t, "order-6"))
	require.NoError(t, run(ctx, pool, h, resend))
	require.NoError(t, run(ctx, pool, h, resend))
	out := outbox(t, pool)
	require.Len(t, out, 2, "the first reply and one replay; the redelivered resend is dropped")
	require.Equal(t, first.Envelope.MessageID, out[0].CausationID)
	require.Equal(t, resend.Envelope.MessageID, out[1].CausationID)
	rows, err := pool.Query(ctx, `SELECT message_id FROM saga_inbox WHERE consumer = 'inventory.commands'`)
	require.NoError(t, err)
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{resend.Envelope.MessageID}, claimed, "only the replayed resend is claimed")
}

// TestBatchRecordWrittenElsewhereFailsTheBatch: a command's record that
// another transaction commits while the command runs in a batch (the same
// command handled there, or its compensation recording it) makes the
// batch's write of its records fail, so the effect rolls back with it.
func TestBatchRecordWrittenElsewhereFailsTheBatch(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	fn := reserving(t)
	d := command(t, "order-8")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	wakes := txq.NewWakes(tx)
	stage := txq.NewStage(tx, wakes)
	btx := txq.New(tx, wakes, stage)
	require.NoError(t, participant.ReadAhead(ctx, btx, "inventory", []*consumer.Delivery{d}))
	_, err = fn(participant.WithCommand(ctx, &d.Envelope), btx, d.Message)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(other pgx.Tx) error {
		first, err := participant.Once(ctx, other, "inventory", participant.CommandKey(d.Message))
		require.True(t, first)
		return err
	}))
	err = stage.Flush(ctx)
	require.ErrorContains(t, err, "wrote 0 of the batch's 1 records")
}

// TestReadAheadFailureIsTheBatchs: a command whose key the table cannot
// take (a NUL byte) fails the batch handler's read of the whole batch,
// before any command ran; the consumer then charges no delivery and applies
// the batch one delivery at a time (runtime/consumer's
// TestStagedOutboxRows).
func TestReadAheadFailureIsTheBatchs(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	fn := reserving(t)
	good := command(t, "order-1")
	batch := []*consumer.Delivery{good, command(t, "bad\x00key")}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	wakes := txq.NewWakes(tx)
	err = participant.ReadAhead(ctx, txq.New(tx, wakes, txq.NewStage(tx, wakes)), "inventory", batch)
	require.ErrorContains(t, err, "read the batch's 2 keys")
	require.NoError(t, tx.Rollback(ctx))

	// Alone (the savepoint path: no batch), order-1 is fine.
	require.NoError(t, run(ctx, pool, participant.Handler(fn), good))
}
