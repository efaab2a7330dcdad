package broker

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrInvalidMessage: the message cannot be put in an AMQP frame (a name or
// property longer than a short string holds, a header value AMQP has no type
// for). Publisher fails such a message alone, without sending it: written
// to the connection, it would make the client library close the connection
// and fail every other message in flight. Sending it again cannot succeed.
var ErrInvalidMessage = errors.New("message cannot be sent over AMQP")

// maxShortString is the longest AMQP short string: exchange and queue
// names, routing keys, header names and most message properties.
const maxShortString = 255

// CheckShortString reports, as ErrInvalidMessage, a value of the field
// named what that does not fit an AMQP short string.
func CheckShortString(what, v string) error {
	if len(v) > maxShortString {
		return fmt.Errorf("%w: %s is %d bytes, at most %d fit", ErrInvalidMessage, what, len(v), maxShortString)
	}
	return nil
}

// CheckHeaderNames reports, as ErrInvalidMessage, a header name (at any
// depth of nested tables and arrays) that does not fit an AMQP short
// string.
func CheckHeaderNames(h map[string]any) error {
	for k, v := range h {
		if len(k) > maxShortString { // checked first: the label allocates
			return CheckShortString("header name "+truncateName(k), k)
		}
		if err := checkNestedNames(v); err != nil {
			return fmt.Errorf("header %q: %w", truncateName(k), err)
		}
	}
	return nil
}

func checkNestedNames(v any) error {
	switch x := v.(type) {
	case map[string]any:
		return CheckHeaderNames(x)
	case amqp.Table:
		return CheckHeaderNames(x)
	case []any:
		for _, e := range x {
			if err := checkNestedNames(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// truncateName shortens a name for an error message.
func truncateName(s string) string {
	if len(s) <= 40 {
		return s
	}
	return s[:40] + "…"
}

// CheckEnvelope reports, as ErrInvalidMessage, a routing or envelope field
// that does not fit an AMQP short string, or a header name that does not
// (outbox.Enqueue refuses such a message before it is stored).
func CheckEnvelope(exchange, routingKey, messageID, correlationID, messageType string, headers map[string]any) error {
	for _, f := range [...]struct{ what, v string }{
		{"exchange", exchange}, {"routing key", routingKey},
		{"message id", messageID}, {"correlation id", correlationID}, {"message type", messageType},
	} {
		if err := CheckShortString(f.what, f.v); err != nil {
			return err
		}
	}
	return CheckHeaderNames(headers)
}

// checkOutgoing reports why m cannot be published, as ErrInvalidMessage.
func checkOutgoing(m *Outgoing) error {
	p := &m.Publishing
	for _, f := range [...]struct{ what, v string }{
		{"content type", p.ContentType}, {"content encoding", p.ContentEncoding}, {"reply to", p.ReplyTo},
		{"expiration", p.Expiration}, {"user id", p.UserId}, {"app id", p.AppId},
	} {
		if err := CheckShortString(f.what, f.v); err != nil {
			return err
		}
	}
	if err := CheckEnvelope(m.Exchange, m.RoutingKey, p.MessageId, p.CorrelationId, p.Type, p.Headers); err != nil {
		return err
	}
	if err := p.Headers.Validate(); err != nil {
		return fmt.Errorf("%w: headers: %w", ErrInvalidMessage, err)
	}
	return nil
}
