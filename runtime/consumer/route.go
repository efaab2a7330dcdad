package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
)

// HeaderLastError carries the error of the failed attempt on a retry copy,
// so the next attempt's logs and an operator looking at a tier queue can see
// why the message is waiting.
const HeaderLastError = "x-last-error"

// Limits on the failure text carried in headers (AMQP frames are small) and
// stored in saga_parked.reason.
const (
	maxHeaderReason = 1024
	maxStoredReason = 8192
)

// routing returns the original exchange and routing key of a delivery: the
// ones recorded on its first retry, or the delivery's own (a message back
// from a tier queue arrives through the default exchange).
func routing(raw *amqp.Delivery) (exchange, routingKey string) {
	exchange, routingKey = raw.Exchange, raw.RoutingKey
	if s, ok, err := message.HeaderString(raw.Headers, message.HeaderOrigExchange); ok && err == nil {
		exchange = s
	}
	if s, ok, err := message.HeaderString(raw.Headers, message.HeaderOrigRoutingKey); ok && err == nil {
		routingKey = s
	}
	return exchange, routingKey
}

// firstFailureAt returns the time of the delivery's first failure: the one
// recorded on its first retry, or now.
func (c *Consumer) firstFailureAt(raw *amqp.Delivery) time.Time {
	if t, ok, err := message.HeaderTime(raw.Headers, message.HeaderFirstFailureAt); ok && err == nil {
		return t
	}
	return c.now().UTC()
}

// copyPublishing returns raw as a new publishing with headers h: every
// property is kept except the per-message expiration (the tier queue sets
// the delay) and the user id (the broker checks it against the publishing
// connection's user). The message is persistent.
func copyPublishing(raw *amqp.Delivery, h amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         h,
		ContentType:     raw.ContentType,
		ContentEncoding: raw.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        raw.Priority,
		CorrelationId:   raw.CorrelationId,
		ReplyTo:         raw.ReplyTo,
		MessageId:       raw.MessageId,
		Timestamp:       raw.Timestamp,
		Type:            raw.Type,
		AppId:           raw.AppId,
		Body:            raw.Body,
	}
}

// retryPublishing is the copy of it sent to its tier queue: attempt + 1, the
// first failure's time, the last error, and the original routing.
func (c *Consumer) retryPublishing(it *item) amqp.Publishing {
	h := maps.Clone(it.raw.Headers)
	if h == nil {
		h = amqp.Table{}
	}
	exchange, routingKey := routing(it.raw)
	h[message.HeaderAttempt] = int32(min(it.attempt+1, 1<<31-1))
	h[message.HeaderFirstFailureAt] = c.firstFailureAt(it.raw).Format(time.RFC3339Nano)
	h[message.HeaderOrigExchange] = exchange
	h[message.HeaderOrigRoutingKey] = routingKey
	h[HeaderLastError] = truncate(it.class.String()+": "+it.err.Error(), maxHeaderReason)
	delete(h, headerDeliveryCount) // a new message to the broker: its count starts again
	return copyPublishing(it.raw, h)
}

// parkPublishing is the copy of it sent to the parking lot, with the reason
// and origin in headers. A message without an id (an invalid envelope) gets
// one (see parkIDFor), so the parked copy and its saga_parked row can be
// matched.
func (c *Consumer) parkPublishing(it *item) amqp.Publishing {
	h := maps.Clone(it.raw.Headers)
	if h == nil {
		h = amqp.Table{}
	}
	exchange, routingKey := routing(it.raw)
	h[message.HeaderAttempt] = int32(it.attempt)
	h[message.HeaderParkReason] = truncate(it.err.Error(), maxHeaderReason)
	h[message.HeaderParkClass] = it.parkClass()
	h[message.HeaderOrigExchange] = exchange
	h[message.HeaderOrigRoutingKey] = routingKey
	h[message.HeaderOrigQueue] = c.cfg.Queue
	h[message.HeaderFirstFailureAt] = c.firstFailureAt(it.raw).Format(time.RFC3339Nano)
	delete(h, HeaderLastError)
	delete(h, headerDeliveryCount)
	p := copyPublishing(it.raw, h)
	p.MessageId = it.parkID
	return p
}

// insertParked records it in saga_parked within tx (parked.Insert). A
// message already parked from this queue and still open (neither replayed
// nor dismissed since) is not recorded twice, so a redelivery after a lost
// ack (or a failed parking-lot publish) keeps one row. Text is made
// storable: PostgreSQL text cannot hold NUL bytes or invalid UTF-8, and a
// malformed message must still be parkable.
func (c *Consumer) insertParked(ctx context.Context, tx pgx.Tx, it *item) error {
	if it.parkID == "" {
		it.parkID = it.raw.MessageId
		if it.parkID == "" {
			it.parkID = parkIDFor(c.cfg.Queue, it.raw)
		}
	}
	raw := it.raw
	var sagaID, sagaType string
	if it.d != nil {
		sagaID, sagaType = it.d.Envelope.SagaID, it.d.Envelope.SagaType
	} else {
		sagaID, _, _ = message.HeaderString(raw.Headers, message.HeaderSagaID)
		sagaType, _, _ = message.HeaderString(raw.Headers, message.HeaderSagaType)
	}
	if id, err := uuid.Parse(sagaID); err == nil {
		sagaID = id.String() // the form saga tables, timelines and filters use
	}
	// A message that names no saga is found by its correlation field (the
	// saga's business key or id): keep it, so it can be joined to its saga.
	var correlationKey string
	if sagaID == "" && it.d != nil && it.d.Message != nil {
		correlationKey = it.d.Message.CorrelationKey()
	}
	headers, err := json.Marshal(jsonValue(map[string]any(raw.Headers)))
	if err != nil {
		return fmt.Errorf("encode headers of parked message: %w", err)
	}
	exchange, routingKey := routing(raw)
	return parked.Insert(ctx, tx, parked.New{
		MessageID: text(it.parkID), Queue: text(c.cfg.Queue), MessageType: text(raw.Type), SagaID: text(sagaID),
		SagaType: text(sagaType), CorrelationID: text(raw.CorrelationId), Class: it.parkClass(),
		Reason: text(truncate(it.err.Error(), maxStoredReason)), Attempts: it.attempt,
		Exchange: text(exchange), RoutingKey: text(routingKey), Headers: headers, Body: raw.Body,
		FirstFailureAt: c.firstFailureAt(raw), CorrelationKey: text(correlationKey),
	})
}

// parkNamespace names the ids parkIDFor derives.
var parkNamespace = uuid.MustParse("8f0c1d9e-4b1a-4c57-9a53-7e0f6a2d5b11")

// parkIDFor derives the id a message without one is parked under from what
// it carries, so that the same message delivered again (a lost ack, a
// failed parking-lot publish) gets the same id and keeps one saga_parked
// row. What the broker or this consumer add on the way (delivery counts,
// dead-letter history, the retry's attempt and error) is left out.
func parkIDFor(queue string, raw *amqp.Delivery) string {
	h := maps.Clone(raw.Headers)
	for _, k := range []string{headerDeliveryCount, "x-death", "x-first-death-exchange", "x-first-death-queue",
		"x-first-death-reason", "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason",
		HeaderLastError, message.HeaderAttempt, message.HeaderFirstFailureAt} {
		delete(h, k)
	}
	headers, err := json.Marshal(jsonValue(map[string]any(h))) // map keys sorted
	if err != nil {
		headers = []byte(err.Error())
	}
	exchange, routingKey := routing(raw)
	name := make([]byte, 0, 256+len(raw.Body)+len(headers))
	for _, part := range []string{queue, exchange, routingKey, raw.Type, raw.CorrelationId, raw.AppId,
		raw.Timestamp.UTC().Format(time.RFC3339Nano), string(headers)} {
		name = append(name, part...)
		name = append(name, 0)
	}
	name = append(name, raw.Body...)
	return uuid.NewSHA1(parkNamespace, name).String()
}

// text makes s storable in a PostgreSQL text column.
func text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// truncate shortens s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// jsonValue converts an AMQP header value into one encoding/json encodes
// and jsonb accepts: tables become objects, timestamps RFC 3339 strings,
// decimals strings, byte slices strings when they are valid UTF-8 (base64
// otherwise), and every string is made storable.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil, bool, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return x
	case float32:
		return jsonValue(float64(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
		return x
	case string:
		return text(x)
	case []byte:
		if utf8.Valid(x) {
			return text(string(x))
		}
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return fmt.Sprintf("%de-%d", x.Value, x.Scale)
	case amqp.Table:
		return jsonValue(map[string]any(x))
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[text(k)] = jsonValue(e)
		}
		return m
	case []any:
		a := make([]any, len(x))
		for i, e := range x {
			a[i] = jsonValue(e)
		}
		return a
	default:
		return text(fmt.Sprint(x))
	}
}

// finish routes failed items to their tier or the parking lot and
// acknowledges every item that is settled. An item whose publish failed is
// not acknowledged; the error makes the session end so it is redelivered.
func (s *session) finish(ctx context.Context, items []*item) error {
	c := s.c
	var tags []uint64
	var settled []*item
	var routed []*item
	var out []broker.Outgoing
	for _, it := range items {
		switch it.outcome {
		case outcomeDone, outcomeDuplicate:
			tags = append(tags, it.raw.DeliveryTag)
			settled = append(settled, it)
		case outcomeRetry:
			routed = append(routed, it)
			out = append(out, broker.Outgoing{RoutingKey: broker.TierQueue(c.cfg.Queue, it.tier), Publishing: c.retryPublishing(it)})
		case outcomePark:
			routed = append(routed, it)
			out = append(out, broker.Outgoing{RoutingKey: broker.ParkingQueue(c.cfg.Queue), Publishing: c.parkPublishing(it)})
		}
	}
	var routeErr error
	if len(out) > 0 {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		errs := c.pub.Publish(pctx, out)
		cancel()
		for i, it := range routed {
			if errs[i] != nil {
				routeErr = errors.Join(routeErr, fmt.Errorf("message %q: publish to %q: %w", it.messageID(), out[i].RoutingKey, errs[i]))
				continue
			}
			tags = append(tags, it.raw.DeliveryTag)
			settled = append(settled, it)
			// The handler's context: a telemetry.NewLogHandler adds the
			// delivery's saga, correlation and causation ids.
			lctx := it.handlerContext(ctx)
			switch {
			case it.outcome == outcomeRetry && retry.IsEarly(it.err):
				c.log.InfoContext(lctx, "message arrived before what it waits for; retrying after a delay",
					slog.String("message_id", it.messageID()), slog.Int("attempt", it.attempt),
					slog.String("delay", it.tier.String()), slog.Any("reason", it.err))
			case it.outcome == outcomeRetry:
				c.log.WarnContext(lctx, "message failed; retrying after a delay",
					slog.String("message_id", it.messageID()), slog.Int("attempt", it.attempt),
					slog.String("class", it.class.String()), slog.String("delay", it.tier.String()), slog.Any("error", it.err))
			default:
				c.log.ErrorContext(lctx, "message parked",
					slog.String("message_id", it.messageID()), slog.Int("attempt", it.attempt),
					slog.String("class", it.parkClass()), slog.Any("error", it.err))
			}
		}
	}
	if err := s.acker.ack(tags); err != nil {
		// The channel is gone: the session ends through its close
		// notification and the deliveries come back; the inbox makes
		// their second handling a no-op.
		c.log.Warn("acknowledgement failed; deliveries will be redelivered", slog.Any("error", err))
	} else if len(tags) > 0 {
		s.progress.Store(true)
		c.redelivered.forget(settled)
		c.tel.settled(ctx, settled, c.now())
		if c.onSettle != nil {
			for _, it := range settled {
				c.onSettle(it.messageID(), it.outcome.String())
			}
		}
	}
	if routeErr != nil {
		return &routeError{routeErr}
	}
	return nil
}

// routeError: retry or parked copies could not be published, so their
// deliveries were not acknowledged (see restartsAfresh).
type routeError struct{ err error }

func (e *routeError) Error() string { return "route failed deliveries: " + e.err.Error() }

func (e *routeError) Unwrap() error { return e.err }
