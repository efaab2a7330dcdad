package participant_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/consumer"
	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/sagatest"
)

// inventory is an idempotent participant that records every effect it
// applies, for the overtaking tests: ReserveInventory and ReleaseInventory.
type inventory struct{ effects []string }

func (i *inventory) fn(t *testing.T) participant.Func {
	return participant.Idempotent("inventory", registry(t),
		func(_ context.Context, _ pgx.Tx, cmd message.Message) (message.Message, error) {
			i.effects = append(i.effects, cmd.SagaMessageInfo().FullName+" "+cmd.(*sagatest.Message).GetValue())
			if cmd.SagaMessageInfo() == releaseInfo {
				return msg(releasedInfo, cmd.(*sagatest.Message).GetValue()), nil
			}
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), nil
		})
}

// compensation returns a delivery of ReleaseInventory for order that names
// the command it undoes, as the saga sends it for a step that timed out.
func compensation(t *testing.T, order string, undoes message.Message) *consumer.Delivery {
	t.Helper()
	d := command(t, order)
	m := msg(releaseInfo, order)
	env, err := message.New(m, message.Meta{SagaID: d.Envelope.SagaID, CorrelationID: d.Envelope.SagaID})
	require.NoError(t, err)
	env.Headers = map[string]any{message.HeaderCompensates: message.OnceKey(undoes, 0)}
	return &consumer.Delivery{Envelope: env, Message: m, Queue: "inventory.commands", Attempt: 1}
}

// TestCompensationOvertakingItsCommand: the saga compensates a step that
// stopped waiting, and the compensation reaches the participant before the
// command it undoes (that one still in a retry tier). The compensation
// records the command as done, so the command, arriving later, has no
// effect and sends no reply; the participant's code knows nothing of it.
func TestCompensationOvertakingItsCommand(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	inv := &inventory{}
	h := participant.Handler(inv.fn(t))

	reserve := command(t, "order-7")
	require.NoError(t, run(ctx, pool, h, compensation(t, "order-7", reserve.Message)))
	require.NoError(t, run(ctx, pool, h, reserve))
	require.Equal(t, []string{releaseInfo.FullName + " order-7"}, inv.effects, "the overtaken command has no effect")
	rows := outbox(t, pool)
	require.Len(t, rows, 1, "and sends no reply")
	require.Equal(t, releasedInfo.FullName, rows[0].MessageType)
	var once string
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(headers->>'x-saga-once', '') FROM saga_outbox WHERE message_id = $1`,
		rows[0].MessageID).Scan(&once))
	require.Equal(t, "inventory", once, "a reply of a guarded participant says so")

	// In the usual order, the command runs and its compensation after it.
	inv.effects = nil
	reserve = command(t, "order-8")
	require.NoError(t, run(ctx, pool, h, reserve))
	require.NoError(t, run(ctx, pool, h, compensation(t, "order-8", reserve.Message)))
	require.Equal(t, []string{reserveInfo.FullName + " order-8", releaseInfo.FullName + " order-8"}, inv.effects)

	// A compensation without the header (its step had answered, or an
	// operator compensates a completed step) records nothing for the
	// command.
	plain := compensation(t, "order-9", msg(reserveInfo, "order-9"))
	plain.Envelope.Headers = nil
	require.NoError(t, run(ctx, pool, h, plain))
	var records int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_participant_once WHERE idempotency_key = $1`,
		reserveInfo.FullName+"/order-9").Scan(&records))
	require.Zero(t, records)
}

// TestCompensationOvertakingItsCommandInOneBatch: both arrive in one
// consumer batch, the compensation first. The batch reads both keys ahead;
// the compensation records the command as done with the batch's records,
// and the command, later in the same batch, has no effect.
func TestCompensationOvertakingItsCommandInOneBatch(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	inv := &inventory{}
	fn := inv.fn(t)
	reserve := command(t, "order-1")
	batch := []*consumer.Delivery{compensation(t, "order-1", reserve.Message), reserve, command(t, "order-2")}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	wakes := txq.NewWakes(tx)
	stage := txq.NewStage(tx, wakes)
	btx := txq.New(tx, wakes, stage)
	require.NoError(t, participant.ReadAhead(ctx, btx, "inventory", batch))
	var replies []message.Message
	for _, d := range batch {
		stx, scope := txq.WithScope(btx)
		reply, err := fn(participant.WithCommand(ctx, &d.Envelope), stx, d.Message)
		require.NoError(t, err)
		require.NoError(t, scope.Flush(ctx))
		replies = append(replies, reply)
	}
	require.NoError(t, stage.Flush(ctx))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{releaseInfo.FullName + " order-1", reserveInfo.FullName + " order-2"}, inv.effects)
	require.Nil(t, replies[1], "the overtaken command answers nothing")
	var records int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM saga_participant_once`).Scan(&records))
	require.Equal(t, 3, records, "the release, the overtaken reservation (kept) and order-2")
}

// TestReplyLaterTyped: a participant takes the command with Later, replies
// later with ReplyLater from another transaction; the reply continues the
// command's conversation and is stored in its once record, so a resend of
// the command gets it. A reply for another command type is refused, and a
// Pending survives its text form.
func TestReplyLaterTyped(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	var pending participant.Pending
	effects := 0
	h := participant.Handler(participant.Idempotent("inventory", registry(t),
		func(ctx context.Context, _ pgx.Tx, _ message.Message) (message.Message, error) {
			effects++
			p, err := participant.Later(ctx)
			require.NoError(t, err)
			text, err := p.MarshalText()
			require.NoError(t, err)
			require.NoError(t, pending.UnmarshalText(text))
			return nil, participant.ErrReplyLater
		}))
	cmd := command(t, "order-4")
	require.NoError(t, run(ctx, pool, h, cmd))
	require.Empty(t, outbox(t, pool), "nothing is sent now")
	require.Equal(t, cmd.Envelope.MessageID, pending.MessageID)
	require.Equal(t, reserveInfo.FullName, pending.Command)
	require.Equal(t, "inventory", pending.Service)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return participant.ReplyLater(ctx, tx, pending, releaseInfo.FullName, msg(releasedInfo, "order-4"))
	})
	require.ErrorContains(t, err, "the pending command is a "+reserveInfo.FullName)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return participant.ReplyLater(ctx, tx, pending, reserveInfo.FullName, msg(reservedInfo, "order-4"))
	}))
	rows := outbox(t, pool)
	require.Len(t, rows, 1)
	require.Equal(t, cmd.Envelope.MessageID, rows[0].CausationID, "the reply answers the command")
	var once string
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(headers->>'x-saga-once', '') FROM saga_outbox WHERE message_id = $1`,
		rows[0].MessageID).Scan(&once))
	require.Equal(t, "inventory", once, "the late reply says the command ran under the once guard")
	require.Equal(t, cmd.Envelope.SagaID, rows[0].SagaID)
	require.Equal(t, cmd.Envelope.Traceparent, rows[0].Traceparent)

	resend := command(t, "order-4")
	require.NoError(t, run(ctx, pool, h, resend))
	require.Equal(t, 1, effects, "the resend has no second effect")
	rows = outbox(t, pool)
	require.Len(t, rows, 2)
	require.Equal(t, reservedInfo.FullName, rows[1].MessageType, "the resend gets the late reply")
	require.Equal(t, resend.Envelope.MessageID, rows[1].CausationID)

	var bad participant.Pending
	require.Error(t, bad.UnmarshalText([]byte("not base64!")))
	_, err = participant.Later(ctx)
	require.Error(t, err, "Later outside a command's handling")
}

// TestCompensationWaitsForItsRunningCommand: the command is running in
// another transaction (its once record written, not committed) when its
// compensation arrives. The compensation's record of the command waits for
// that transaction, so the compensation runs after the command committed
// and sees the effect it must undo.
func TestCompensationWaitsForItsRunningCommand(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE holds (loan text PRIMARY KEY)`)
	require.NoError(t, err)
	reserve := command(t, "order-3")
	release := compensation(t, "order-3", reserve.Message)

	// The command's transaction: its guard and its effect, not committed.
	running, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = running.Rollback(ctx) }()
	reserveFn := participant.Idempotent("inventory", registry(t),
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			_, err := tx.Exec(ctx, `INSERT INTO holds VALUES ($1)`, cmd.(*sagatest.Message).GetValue())
			return msg(reservedInfo, cmd.(*sagatest.Message).GetValue()), err
		})
	_, err = reserveFn(participant.WithCommand(ctx, &reserve.Envelope), running, reserve.Message)
	require.NoError(t, err)

	var sawHold bool
	releaseFn := participant.Idempotent("inventory", registry(t),
		func(ctx context.Context, tx pgx.Tx, cmd message.Message) (message.Message, error) {
			err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM holds WHERE loan = $1)`, cmd.(*sagatest.Message).GetValue()).Scan(&sawHold)
			return msg(releasedInfo, cmd.(*sagatest.Message).GetValue()), err
		})
	done := make(chan error, 1)
	go func() {
		// In a handler's write scope, as a consumer runs it.
		done <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			stx, scope := txq.WithScope(tx)
			hctx := participant.WithCommand(ctx, &release.Envelope)
			if _, err := releaseFn(hctx, stx, release.Message); err != nil {
				return err
			}
			return scope.Flush(hctx)
		})
	}()
	testenv.WaitBlocked(t, pool, "%INSERT INTO saga_participant_once%")
	require.NoError(t, running.Commit(ctx))
	require.NoError(t, <-done)
	require.True(t, sawHold, "the compensation ran after the command committed and saw its effect")
}
