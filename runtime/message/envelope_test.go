package message_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protosaga/saga/runtime/message"
)

// testMsg is a message.Message over a well-known type whose encoding depends
// on map order, so determinism is observable.
type testMsg struct {
	*structpb.Struct
	info *message.Info
}

func (m testMsg) SagaMessageInfo() *message.Info { return m.info }
func (m testMsg) IdempotencyKey() string         { return "idem-" + m.Fields["order"].GetStringValue() }
func (m testMsg) CorrelationKey() string         { return m.Fields["order"].GetStringValue() }

var testInfo = &message.Info{
	FullName:      "shop.order.v1.ReserveInventory",
	Kind:          message.KindCommand,
	Exchange:      "shop.commands",
	RoutingKey:    "inventory.reserve",
	SchemaVersion: 3,
}

func newTestMsg(t *testing.T) testMsg {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{"order": "o-1", "a": 1, "b": "x", "c": true, "d": "y", "e": 2.5})
	require.NoError(t, err)
	return testMsg{Struct: s, info: testInfo}
}

func TestNew(t *testing.T) {
	t.Parallel()

	m := newTestMsg(t)
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.FixedZone("x", 3600))
	e, err := message.New(m, message.Meta{
		CausationID: "cause-1", SagaID: "saga-1", SagaType: "PlaceOrder",
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "k=v",
		OccurredAt: at,
	})
	require.NoError(t, err)

	id, err := uuid.Parse(e.MessageID)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), id.Version())
	require.Equal(t, "saga-1", e.CorrelationID, "correlation defaults to the saga id")
	require.Equal(t, "cause-1", e.CausationID)
	require.Equal(t, "shop.order.v1.ReserveInventory", e.MessageType)
	require.Equal(t, int32(3), e.SchemaVersion)
	require.Equal(t, "idem-o-1", e.IdempotencyKey)
	require.Equal(t, "shop.commands", e.Exchange)
	require.Equal(t, "inventory.reserve", e.RoutingKey)
	require.True(t, at.Equal(e.OccurredAt))
	require.Equal(t, time.UTC, e.OccurredAt.Location())

	got := &structpb.Struct{}
	require.NoError(t, proto.Unmarshal(e.Body, got))
	require.True(t, proto.Equal(m.Struct, got))

	// Deterministic: the same message always encodes to the same bytes.
	for range 20 {
		e2, err := message.New(m, message.Meta{})
		require.NoError(t, err)
		require.Equal(t, e.Body, e2.Body)
		require.NotEqual(t, e.MessageID, e2.MessageID)
		require.Equal(t, e2.MessageID, e2.CorrelationID, "correlation defaults to the message id")
		require.False(t, e2.OccurredAt.IsZero())
		require.Equal(t, time.UTC, e2.OccurredAt.Location())
	}

	e3, err := message.New(m, message.Meta{MessageID: "fixed", CorrelationID: "corr"})
	require.NoError(t, err)
	require.Equal(t, "fixed", e3.MessageID)
	require.Equal(t, "corr", e3.CorrelationID)
}

func TestNewErrors(t *testing.T) {
	t.Parallel()

	_, err := message.New(nil, message.Meta{})
	require.ErrorContains(t, err, "nil message")

	_, err = message.New(testMsg{Struct: &structpb.Struct{}}, message.Meta{})
	require.ErrorContains(t, err, "no info")

	bad := *testInfo
	bad.SchemaVersion = 0
	_, err = message.New(testMsg{Struct: &structpb.Struct{}, info: &bad}, message.Meta{})
	require.ErrorContains(t, err, "schema version 0")
}

// deliver turns a publishing into the delivery a consumer would receive.
func deliver(p amqp.Publishing, exchange, key string) *amqp.Delivery {
	return &amqp.Delivery{
		Headers: p.Headers, ContentType: p.ContentType, DeliveryMode: p.DeliveryMode,
		CorrelationId: p.CorrelationId, MessageId: p.MessageId, Timestamp: p.Timestamp,
		Type: p.Type, Body: p.Body, Exchange: exchange, RoutingKey: key,
	}
}

func TestPublishingRoundTrip(t *testing.T) {
	t.Parallel()

	e, err := message.New(newTestMsg(t), message.Meta{
		CausationID: "c", SagaID: "s", SagaType: "T", Traceparent: "tp", Tracestate: "ts",
	})
	require.NoError(t, err)
	e.Headers = map[string]any{
		message.HeaderAttempt:        2,
		"nested":                     map[string]any{"k": uint64(7), "l": []string{"a"}},
		message.HeaderSagaID:         "must not override the field",
		message.HeaderOccurredAt:     "must not override the field",
		message.HeaderParkReason:     "why",
		message.HeaderFirstFailureAt: time.Unix(10, 0).UTC(),
	}

	p := e.Publishing()
	require.NoError(t, p.Headers.Validate())
	require.Equal(t, message.ContentType, p.ContentType)
	require.Equal(t, amqp.Persistent, p.DeliveryMode)
	require.Equal(t, e.MessageID, p.MessageId)
	require.Equal(t, "s", p.CorrelationId)
	require.Equal(t, e.MessageType, p.Type)
	require.Equal(t, e.OccurredAt, p.Timestamp)
	require.Equal(t, int32(3), p.Headers[message.HeaderSchemaVersion])
	require.Equal(t, "s", p.Headers[message.HeaderSagaID])
	require.Equal(t, amqp.Table{"k": int64(7), "l": []any{"a"}}, p.Headers["nested"])

	got, err := message.FromDelivery(deliver(p, "ex", "rk"))
	require.NoError(t, err)
	want := e
	want.Exchange, want.RoutingKey = "ex", "rk"
	want.Headers = map[string]any{
		message.HeaderAttempt:        2,
		"nested":                     amqp.Table{"k": int64(7), "l": []any{"a"}},
		message.HeaderParkReason:     "why",
		message.HeaderFirstFailureAt: time.Unix(10, 0).UTC(),
	}
	require.Equal(t, want, got)
}

func TestFromDeliveryErrors(t *testing.T) {
	t.Parallel()

	_, err := message.FromDelivery(nil)
	require.ErrorIs(t, err, message.ErrInvalidMetadata)

	tests := []struct {
		name    string
		d       amqp.Delivery
		wantErr []string
	}{
		{"empty", amqp.Delivery{}, []string{"message id: missing", "type: missing", "x-schema-version: missing"}},
		{"schema version not a number", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: "three"}},
			[]string{`message m: envelope x-schema-version: "three" is not an integer`}},
		{"schema version zero", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: int64(0)}},
			[]string{"x-schema-version: 0 is out of range"}},
		{"schema version too big", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: int64(1) << 40}},
			[]string{"out of range"}},
		{"schema version bool", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: true}},
			[]string{"type bool is not an integer"}},
		{"bad saga id", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: int32(1), message.HeaderSagaID: 1.5}},
			[]string{"x-saga-id: value of type float64 is not a string"}},
		{"bad occurred at", amqp.Delivery{MessageId: "m", Type: "t", Headers: amqp.Table{message.HeaderSchemaVersion: int32(1), message.HeaderOccurredAt: "yesterday"}},
			[]string{`x-occurred-at: "yesterday" is not an RFC 3339 time`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := message.FromDelivery(&tt.d)
			require.ErrorIs(t, err, message.ErrInvalidMetadata)
			var me *message.MetadataError
			require.True(t, errors.As(err, &me))
			for _, w := range tt.wantErr {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestFromDeliveryLenientTypes(t *testing.T) {
	t.Parallel()

	for _, v := range []any{int8(4), int16(4), int32(4), int64(4), int(4), uint8(4), uint16(4), uint32(4), uint64(4),
		float32(4), float64(4), "4", " 4 ", []byte("4"), amqp.Decimal{Value: 4}} {
		d := amqp.Delivery{MessageId: "m", Type: "t", Timestamp: time.Unix(100, 0),
			Headers: amqp.Table{message.HeaderSchemaVersion: v, message.HeaderSagaID: []byte("sid"), message.HeaderCausationID: int64(9)}}
		e, err := message.FromDelivery(&d)
		require.NoError(t, err, "%T", v)
		require.Equal(t, int32(4), e.SchemaVersion)
		require.Equal(t, "sid", e.SagaID)
		require.Equal(t, "9", e.CausationID)
		require.Equal(t, time.Unix(100, 0).UTC(), e.OccurredAt, "falls back to the timestamp property")
	}
}

func TestHeaderInt(t *testing.T) {
	t.Parallel()

	h := map[string]any{"nil": nil, "big": uint64(1 << 63), "frac": 1.5, "nan": "NaN", "dec": amqp.Decimal{Value: 15, Scale: 1}, "neg": int8(-3)}
	_, ok, err := message.HeaderInt(h, "absent")
	require.False(t, ok)
	require.NoError(t, err)
	_, ok, err = message.HeaderInt(h, "nil")
	require.False(t, ok)
	require.NoError(t, err)
	for _, k := range []string{"big", "frac", "nan", "dec"} {
		_, ok, err = message.HeaderInt(h, k)
		require.True(t, ok)
		require.Error(t, err, k)
	}
	v, ok, err := message.HeaderInt(h, "neg")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(-3), v)

	long := strings.Repeat("x", 1000)
	_, _, err = message.HeaderInt(map[string]any{"k": long}, "k")
	require.Less(t, len(err.Error()), 100, "errors quote a bounded prefix of hostile input")
}

func FuzzFromDelivery(f *testing.F) {
	f.Add("id", "type", byte(0), "3", "saga", []byte("body"))
	f.Add("", "", byte(1), "", "", []byte{})
	f.Add("id", "t", byte(2), "-1", "\xff", []byte(nil))
	f.Add("id", "t", byte(3), "2024-01-02T03:04:05Z", "s", []byte("b"))
	f.Fuzz(func(t *testing.T, id, typ string, kind byte, version, saga string, body []byte) {
		var sv any
		switch kind % 6 {
		case 0:
			sv = version
		case 1:
			sv = []byte(version)
		case 2:
			sv = int64(len(version)) - 2
		case 3:
			sv = float64(len(version)) / 2
		case 4:
			sv = nil
		case 5:
			sv = amqp.Table{"v": version}
		}
		d := &amqp.Delivery{MessageId: id, Type: typ, Body: body, Headers: amqp.Table{
			message.HeaderSchemaVersion: sv,
			message.HeaderSagaID:        []byte(saga),
			message.HeaderOccurredAt:    version,
			message.HeaderAttempt:       version,
		}}
		e, err := message.FromDelivery(d)
		if err != nil {
			require.ErrorIs(t, err, message.ErrInvalidMetadata)
			return
		}
		require.NotEmpty(t, e.MessageID)
		require.NotEmpty(t, e.MessageType)
		require.GreaterOrEqual(t, e.SchemaVersion, int32(1))

		// A valid envelope survives a round trip unchanged.
		p := e.Publishing()
		require.NoError(t, p.Headers.Validate())
		e2, err := message.FromDelivery(deliver(p, e.Exchange, e.RoutingKey))
		require.NoError(t, err)
		require.Equal(t, e, e2)
	})
}
