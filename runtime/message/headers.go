package message

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HeaderInt reads an integer header. Brokers, other clients and JSON round
// trips deliver integers as any width (int8 … int64, uint8 … uint64),
// as integral floats, decimals with scale 0, or decimal strings; all are
// accepted. ok is false when the header is absent or nil; err is set when it
// is present but not an integer.
func HeaderInt(h map[string]any, key string) (v int64, ok bool, err error) {
	raw, present := h[key]
	if !present || raw == nil {
		return 0, false, nil
	}
	switch x := raw.(type) {
	case int:
		return int64(x), true, nil
	case int8:
		return int64(x), true, nil
	case int16:
		return int64(x), true, nil
	case int32:
		return int64(x), true, nil
	case int64:
		return x, true, nil
	case uint:
		return fromUint(uint64(x))
	case uint8:
		return int64(x), true, nil
	case uint16:
		return int64(x), true, nil
	case uint32:
		return int64(x), true, nil
	case uint64:
		return fromUint(x)
	case float32:
		return fromFloat(float64(x))
	case float64:
		return fromFloat(x)
	case amqp.Decimal:
		if x.Scale != 0 {
			return 0, true, fmt.Errorf("decimal %d scale %d is not an integer", x.Value, x.Scale)
		}
		return int64(x.Value), true, nil
	case string:
		return parseIntString(x)
	case []byte:
		return parseIntString(string(x))
	default:
		return 0, true, fmt.Errorf("value of type %T is not an integer", raw)
	}
}

func fromUint(u uint64) (int64, bool, error) {
	if u > math.MaxInt64 {
		return 0, true, fmt.Errorf("%d overflows int64", u)
	}
	return int64(u), true, nil
}

func fromFloat(f float64) (int64, bool, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, true, fmt.Errorf("%v is not an integer", f)
	}
	return int64(f), true, nil
}

func parseIntString(s string) (int64, bool, error) {
	i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("%q is not an integer", truncate(s))
	}
	return i, true, nil
}

// HeaderString reads a string header. Byte slices (valid UTF-8) and integers
// are accepted and converted, since some clients send ids as longstr bytes
// or numbers. ok is false when the header is absent or nil.
func HeaderString(h map[string]any, key string) (s string, ok bool, err error) {
	raw, present := h[key]
	if !present || raw == nil {
		return "", false, nil
	}
	switch x := raw.(type) {
	case string:
		return x, true, nil
	case []byte:
		if !utf8.Valid(x) {
			return "", true, fmt.Errorf("%d bytes are not valid UTF-8", len(x))
		}
		return string(x), true, nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), true, nil
	default:
		return "", true, fmt.Errorf("value of type %T is not a string", raw)
	}
}

// HeaderTime reads a time header: an AMQP timestamp, or an RFC 3339 string.
// The result is in UTC. ok is false when the header is absent or nil.
func HeaderTime(h map[string]any, key string) (t time.Time, ok bool, err error) {
	raw, present := h[key]
	if !present || raw == nil {
		return time.Time{}, false, nil
	}
	switch x := raw.(type) {
	case time.Time:
		return x.UTC(), true, nil
	case string:
		return parseTime(x)
	case []byte:
		return parseTime(string(x))
	default:
		return time.Time{}, true, fmt.Errorf("value of type %T is not a time", raw)
	}
}

func parseTime(s string) (time.Time, bool, error) {
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s))
	if err != nil {
		return time.Time{}, true, fmt.Errorf("%q is not an RFC 3339 time", truncate(s))
	}
	return t.UTC(), true, nil
}

// truncate shortens s for an error message, so a hostile header cannot blow
// up logs and parking-lot reasons.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
