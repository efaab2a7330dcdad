package message_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
)

// headerValue turns a fuzz byte and string into a header value of one of the
// types AMQP tables carry (and a few they do not), so the readers meet every
// encoding a broker, another client or a JSON round trip can deliver.
func headerValue(kind byte, s string, n int64, f float64) any {
	switch kind % 20 {
	case 0:
		return s
	case 1:
		return []byte(s)
	case 2:
		return n
	case 3:
		return int32(n)
	case 4:
		return int16(n)
	case 5:
		return int8(n)
	case 6:
		return uint64(n)
	case 7:
		return uint32(n)
	case 8:
		return uint8(n)
	case 9:
		return f
	case 10:
		return float32(f)
	case 11:
		return amqp.Decimal{Scale: uint8(n), Value: int32(n)}
	case 12:
		return time.Unix(n%(1<<40), 0)
	case 13:
		return nil
	case 14:
		return true
	case 15:
		return amqp.Table{"nested": s}
	case 16:
		return []any{s, n}
	case 17:
		return int(n)
	case 18:
		return uint(n)
	default:
		return strconv.FormatInt(n, 10)
	}
}

// FuzzHeaderReaders feeds HeaderInt, HeaderString and HeaderTime every value
// type with arbitrary contents. They never panic; "absent" (ok false) means
// exactly a missing or nil header and comes without an error; an accepted
// integer reads back the same from its decimal string; an accepted string
// from bytes is the same text.
func FuzzHeaderReaders(f *testing.F) {
	f.Add(byte(0), "42", int64(42), 42.0)
	f.Add(byte(1), "\xff\xfe", int64(-1), math.NaN())
	f.Add(byte(6), "", int64(-1), math.Inf(1))
	f.Add(byte(9), "x", int64(0), 9.223372036854775807e18)
	f.Add(byte(11), "1.5", int64(3), math.Copysign(0, -1))
	f.Add(byte(19), " 7 ", int64(math.MinInt64), 1e300)
	f.Add(byte(0), "2024-02-29T23:59:60Z", int64(1), 0.5)
	f.Fuzz(func(t *testing.T, kind byte, s string, n int64, fl float64) {
		v := headerValue(kind, s, n, fl)
		h := map[string]any{"k": v}

		i, ok, err := message.HeaderInt(h, "k")
		require.Equal(t, v != nil, ok, "ok must mean present")
		if err == nil && ok {
			back, ok2, err2 := message.HeaderInt(map[string]any{"k": strconv.FormatInt(i, 10)}, "k")
			require.NoError(t, err2)
			require.True(t, ok2)
			require.Equal(t, i, back)
		}
		if !ok {
			require.NoError(t, err)
		}

		str, ok, err := message.HeaderString(h, "k")
		require.Equal(t, v != nil, ok)
		if b, isBytes := v.([]byte); isBytes && err == nil {
			require.Equal(t, string(b), str)
		}
		if !ok {
			require.NoError(t, err)
		}

		tm, ok, err := message.HeaderTime(h, "k")
		require.Equal(t, v != nil, ok)
		if err == nil && ok {
			require.Equal(t, time.UTC, tm.Location(), "times are returned in UTC")
		}

		// Absent and nil are the same to every reader.
		for _, m := range []map[string]any{nil, {}, {"k": nil}} {
			_, ok, err := message.HeaderInt(m, "k")
			require.False(t, ok)
			require.NoError(t, err)
			_, ok, err = message.HeaderString(m, "k")
			require.False(t, ok)
			require.NoError(t, err)
			_, ok, err = message.HeaderTime(m, "k")
			require.False(t, ok)
			require.NoError(t, err)
		}
	})
}

// FuzzFromDeliveryHeaders builds a delivery whose every envelope header has
// an arbitrary type and content (chosen per header by the fuzz bytes), plus
// an extra application header. FromDelivery either refuses it with
// ErrInvalidMetadata or returns an envelope that survives a round trip
// through Publishing unchanged and whose Publishing is a valid AMQP table.
func FuzzFromDeliveryHeaders(f *testing.F) {
	f.Add("id-1", "shop.v1.Thing", []byte{2, 0, 0, 0, 0, 0, 0, 13}, "1", int64(1), 1.0, []byte("body"))
	f.Add("", "", []byte{}, "", int64(0), 0.0, []byte{})
	f.Add("id", "t", []byte{0, 1, 1, 1, 1, 1, 0, 0}, "2024-01-02T03:04:05.123456789Z", int64(7), 7.0, []byte(nil))
	f.Add("\x00id", "t\xff", []byte{9, 15, 16, 14, 3, 11, 12, 19}, "9", int64(1<<31), 2.5, []byte{0xff})
	keys := []string{
		message.HeaderSchemaVersion, message.HeaderSagaID, message.HeaderSagaType, message.HeaderCausationID,
		message.HeaderIdempotency, message.HeaderTraceparent, message.HeaderOccurredAt, "x-application",
	}
	f.Fuzz(func(t *testing.T, id, typ string, kinds []byte, s string, n int64, fl float64, body []byte) {
		headers := amqp.Table{}
		for i, k := range keys {
			kind := byte(i)
			if i < len(kinds) {
				kind = kinds[i]
			}
			if v := headerValue(kind, s, n, fl); v != nil {
				headers[k] = v
			}
		}
		d := &amqp.Delivery{MessageId: id, Type: typ, Body: body, Headers: headers, Exchange: "x", RoutingKey: "k"}
		e, err := message.FromDelivery(d)
		if err != nil {
			require.ErrorIs(t, err, message.ErrInvalidMetadata)
			require.NotEmpty(t, err.Error())
			return
		}
		require.NotEmpty(t, e.MessageID)
		require.NotEmpty(t, e.MessageType)
		require.Positive(t, e.SchemaVersion)
		p := e.Publishing()
		if err := p.Headers.Validate(); err != nil {
			// Extra application headers are carried as they came; a value
			// AMQP cannot encode (here: only from this test's value menu)
			// would have failed at the broker before reaching us.
			require.Contains(t, err.Error(), "x-application")
			return
		}
		e2, err := message.FromDelivery(&amqp.Delivery{
			MessageId: p.MessageId, Type: p.Type, CorrelationId: p.CorrelationId, Timestamp: p.Timestamp,
			Headers: p.Headers, Body: p.Body, Exchange: "x", RoutingKey: "k",
		})
		require.NoError(t, err)
		require.Equal(t, e, e2)
	})
}
