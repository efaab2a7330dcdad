package saga

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/sagadef"
)

// queueCallback is the engine's one touch point with package callback: when
// a transition reaches a state the contract delivers (Definition.Callback),
// it writes the callback row in the transition's transaction, so the
// outcome and its callback commit together. A saga whose data names no
// target (an empty URL or client field) sends none.
func (e *Engine) queueCallback(ctx context.Context, tx pgx.Tx, w row, after sagadef.Instance, from, to string) error {
	cb := e.def.Callback
	if from == to || !cb.Delivers(to) {
		return nil
	}
	url, client := cb.Target(after.Data)
	if url == "" && client == "" {
		return nil
	}
	p := callback.Payload{
		CallbackID:  e.cfg.NewID(),
		Event:       callback.EventFor(to),
		SagaType:    e.def.Name,
		SagaID:      w.ID,
		BusinessKey: w.BusinessKey,
		State:       to,
		OccurredAt:  e.cfg.Now().UTC(),
	}
	switch to {
	case sagadef.StateManualReview:
		p.Reason = after.ReviewReason
	case sagadef.StateFailed, sagadef.StateCancelled:
		p.Reason = after.LastError
	}
	if cb.IncludeData && after.Data != nil {
		data, err := protojson.MarshalOptions{UseProtoNames: false}.Marshal(after.Data)
		if err != nil {
			return fmt.Errorf("saga %s: callback data: %w", w.ID, err)
		}
		p.Data = data
	}
	if url != "" {
		client = "" // the request's own URL wins over a client registration
	}
	return callback.EnqueueTx(ctx, tx, callback.Delivery{Payload: p, URL: url, Client: client})
}
