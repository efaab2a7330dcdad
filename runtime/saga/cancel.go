package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
)

// ErrNoCancel is returned by RequestCancelTx for a saga whose definition
// declares no business cancel message (sagadef.Definition.Cancel), or for a
// message that is not it.
var ErrNoCancel = errors.New("not the saga's cancel message")

// RequestCancelTx asks, in the caller's transaction, for a business cancel:
// it writes the definition's cancel message m to the outbox, and the saga's
// queue delivers it to [Engine.Handle] like any other message once tx
// commits. The engine finds the instance by m's correlation key (the
// business key or the saga id) unless meta names the saga id; who asked and
// why are m's fields the contract names (sagadef.Definition.CancelRequest).
// What the cancel does depends on where the saga is then (see
// sagadef.Cancel): it compensates and ends CANCELLED, or is refused and
// audited. It returns the cancel message's id.
func (e *Engine) RequestCancelTx(ctx context.Context, tx pgx.Tx, m message.Message, meta message.Meta) (messageID string, err error) {
	if err := e.checkCancel(m, meta); err != nil {
		return "", err
	}
	id, err := outbox.Publish(ctx, tx, m, meta)
	if err != nil {
		return "", fmt.Errorf("request cancel of saga %s %q: %w", e.def.Name, m.CorrelationKey(), err)
	}
	return id, nil
}

// RequestCancel is [Engine.RequestCancelTx] in a transaction of its own;
// relays are woken (or the local relay handed the row) after the commit.
func (e *Engine) RequestCancel(ctx context.Context, m message.Message, meta message.Meta) (messageID string, err error) {
	err = e.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		messageID, err = e.RequestCancelTx(ctx, tx, m, meta)
		return err
	})
	return messageID, err
}

func (e *Engine) checkCancel(m message.Message, meta message.Meta) error {
	want := e.def.Cancel.Message
	switch {
	case want == "":
		return fmt.Errorf("request cancel of saga %s: the contract declares no cancel message: %w", e.def.Name, ErrNoCancel)
	case m == nil || m.SagaMessageInfo() == nil:
		return fmt.Errorf("request cancel of saga %s: no message: %w", e.def.Name, ErrNoCancel)
	case m.SagaMessageInfo().FullName != want:
		return fmt.Errorf("request cancel of saga %s: %s is not its cancel message %s: %w",
			e.def.Name, m.SagaMessageInfo().FullName, want, ErrNoCancel)
	case m.CorrelationKey() == "" && meta.SagaID == "":
		return fmt.Errorf("request cancel of saga %s: %s carries no correlation key (business key or saga id) and meta no saga id: %w",
			e.def.Name, want, ErrNoCancel)
	}
	return nil
}
