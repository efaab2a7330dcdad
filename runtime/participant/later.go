package participant

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
)

// Pending is a command its participant answers later: what the reply needs
// to continue the command's conversation (its causation is the command's
// message id, so the saga knows which attempt it answers). A participant
// method takes it with [Later], returns [ErrReplyLater], keeps it with the
// work (it marshals to text for a column of the service's own), and answers
// in another transaction with the generated ReplyTo<Command> function, which
// accepts only the command's reply types.
type Pending struct {
	// Command is the command's full name.
	Command string `json:"command"`
	// MessageID is the command's message id: the reply's causation.
	MessageID     string `json:"message_id"`
	CorrelationID string `json:"correlation_id,omitempty"`
	SagaID        string `json:"saga_id,omitempty"`
	SagaType      string `json:"saga_type,omitempty"`
	Traceparent   string `json:"traceparent,omitempty"`
	Tracestate    string `json:"tracestate,omitempty"`
	// Service and OnceKey name the command's once record when it ran under
	// [Idempotent] (every host-registered participant does): the late reply
	// is stored there too, so a resend of the command gets it.
	Service string `json:"service,omitempty"`
	OnceKey string `json:"once_key,omitempty"`
}

type onceRecordKey struct{}

// onceRecord is the record [Idempotent] keeps for the command being handled.
// [Handler] puts an empty one in the handler's context and Idempotent fills
// it, so that a middleware around Idempotent can take the command with
// [Later] after it ran, as the participant's own code can inside it.
type onceRecord struct {
	service, key string
	// unclaimed is the consumer that claimed nothing in the inbox for the
	// command (consumer.Delivery.Unclaimed), "" when it did or there is no
	// consumer: a command Idempotent answers without writing a record
	// (a resend, an overtaken command) claims it there.
	unclaimed string
	// deduped is set once Idempotent left what drops a redelivery of the
	// command: its record, a claim, or a record of this very message.
	deduped bool
}

// mark tells a reply's receiver, when the command ran under [Idempotent],
// that it did (message.HeaderOnce).
func (r *onceRecord) mark(env *message.Envelope) {
	if r == nil || r.key == "" {
		return
	}
	if env.Headers == nil {
		env.Headers = map[string]any{}
	}
	env.Headers[message.HeaderOnce] = r.service
}

// withOnceRecord returns ctx with a record slot, and the slot: the one ctx
// has, or a new one.
func withOnceRecord(ctx context.Context) (context.Context, *onceRecord) {
	if r, ok := ctx.Value(onceRecordKey{}).(*onceRecord); ok {
		return ctx, r
	}
	r := new(onceRecord)
	return context.WithValue(ctx, onceRecordKey{}, r), r
}

// Later returns the command being handled as a [Pending], inside a
// participant method run by [Handler] (or in a middleware around
// [Idempotent], once Idempotent has run). It fails outside one.
func Later(ctx context.Context) (Pending, error) {
	env, ok := Command(ctx)
	if !ok || env == nil {
		return Pending{}, errors.New("participant: Later called outside a command's handling")
	}
	p := Pending{
		Command: env.MessageType, MessageID: env.MessageID, CorrelationID: env.CorrelationID,
		SagaID: env.SagaID, SagaType: env.SagaType, Traceparent: env.Traceparent, Tracestate: env.Tracestate,
	}
	if r, ok := ctx.Value(onceRecordKey{}).(*onceRecord); ok {
		p.Service, p.OnceKey = r.service, r.key
	}
	return p, nil
}

// plainPending is Pending without its methods, for encoding/json.
type plainPending Pending

// MarshalText encodes p as URL-safe base64 of its JSON form, for storage.
func (p Pending) MarshalText() ([]byte, error) {
	js, err := json.Marshal(plainPending(p))
	if err != nil {
		return nil, fmt.Errorf("encode pending command %s: %w", p.MessageID, err)
	}
	out := make([]byte, base64.RawURLEncoding.EncodedLen(len(js)))
	base64.RawURLEncoding.Encode(out, js)
	return out, nil
}

// UnmarshalText decodes what MarshalText wrote.
func (p *Pending) UnmarshalText(text []byte) error {
	js := make([]byte, base64.RawURLEncoding.DecodedLen(len(text)))
	n, err := base64.RawURLEncoding.Decode(js, text)
	if err != nil {
		return fmt.Errorf("decode pending command: %w", err)
	}
	var v plainPending
	if err := json.Unmarshal(js[:n], &v); err != nil {
		return fmt.Errorf("decode pending command: %w", err)
	}
	if v.Command == "" || v.MessageID == "" {
		return errors.New("decode pending command: command or message id missing")
	}
	*p = Pending(v)
	return nil
}

// Envelope returns the command's envelope as far as a reply needs it
// (ReplyEnvelope builds the reply's from it).
func (p Pending) Envelope() *message.Envelope {
	return &message.Envelope{
		MessageType: p.Command, MessageID: p.MessageID, CorrelationID: p.CorrelationID,
		SagaID: p.SagaID, SagaType: p.SagaType, Traceparent: p.Traceparent, Tracestate: p.Tracestate,
	}
}

// ReplyLater writes reply, answering the pending command p of type command,
// to the outbox in tx: causation is the command's message id, and
// correlation, saga and trace context are the command's. When the command
// ran under [Idempotent], the reply is also stored in its once record, so a
// resend of the command gets it. Generated ReplyTo<Command> functions call
// it with a reply of the command's own types.
func ReplyLater(ctx context.Context, tx pgx.Tx, p Pending, command string, reply message.Message) error {
	if p.Command != command {
		return fmt.Errorf("participant: reply to %s %s: the pending command is a %s", command, p.MessageID, p.Command)
	}
	if p.MessageID == "" {
		return fmt.Errorf("participant: reply to %s: the pending command has no message id", command)
	}
	env, err := ReplyEnvelope(p.Envelope(), reply)
	if err != nil {
		return err
	}
	(&onceRecord{service: p.Service, key: p.OnceKey}).mark(&env)
	if p.Service != "" && p.OnceKey != "" {
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
		if err != nil {
			return fmt.Errorf("participant %s: encode late reply for key %q: %w", p.Service, p.OnceKey, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE saga_participant_once SET reply_type = $3, reply_body = $4
WHERE service = $1 AND idempotency_key = $2 AND reply_type = ''`, p.Service, p.OnceKey, env.MessageType, body); err != nil {
			return fmt.Errorf("participant %s: store late reply for key %q: %w", p.Service, p.OnceKey, err)
		}
	}
	if err := outbox.Enqueue(ctx, tx, env); err != nil {
		return fmt.Errorf("participant: enqueue late reply %s to %s %s: %w", env.MessageType, command, p.MessageID, err)
	}
	return nil
}
