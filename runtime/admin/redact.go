package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/saga"
)

// Redacted replaces the value of every sensitive field in bodies and saga
// data shown by the API and console.
const Redacted = "[REDACTED]"

// body renders a message body for operators: decoded through the registries,
// as protojson with proto field names, sensitive fields redacted. A type no
// registry knows, or a body that does not decode, is shown by size only.
func (s *Server) body(typ string, raw []byte) *Body {
	b := &Body{Type: typ, Size: len(raw)}
	info, ok := s.lookup(typ)
	if !ok || info.New == nil {
		b.Note = "message type unknown to this server: body not shown"
		return b
	}
	m := info.New()
	if err := proto.Unmarshal(raw, m); err != nil {
		b.Note = "body does not decode as " + typ + ": not shown"
		return b
	}
	js, paths, err := redactedJSON(m, info.SensitiveFields)
	if err != nil {
		b.Note = "body could not be rendered: not shown"
		return b
	}
	b.JSON, b.Redacted = js, paths
	return b
}

// data renders an instance's saga data with the sensitive paths of every
// message its definition names redacted (saga data usually copies them). It
// shows nothing when one of those messages is unknown to the registries:
// its sensitive fields are then unknown too.
func (s *Server) data(t *sagaType, m proto.Message, unreadable string) *Body {
	if unreadable != "" {
		return &Body{Type: t.def.DataMessage, Note: unreadable + "; " + saga.UnreadableDataHint}
	}
	if m == nil {
		return nil
	}
	b := &Body{Type: string(m.ProtoReflect().Descriptor().FullName())}
	if raw, err := proto.Marshal(m); err == nil {
		b.Size = len(raw)
	}
	if len(t.unknown) > 0 {
		b.Note = fmt.Sprintf("saga data not shown: message types %s are not registered, so their sensitive fields are unknown", strings.Join(t.unknown, ", "))
		return b
	}
	js, paths, err := redactedJSON(m, t.sensitive)
	if err != nil {
		b.Note = "saga data could not be rendered: not shown"
		return b
	}
	b.JSON, b.Redacted = js, paths
	return b
}

// redactedJSON marshals m with proto field names and replaces the values at
// paths (dot-separated field names; lists are entered element by element)
// with Redacted. It returns the paths that held a value.
func redactedJSON(m proto.Message, paths []string) (json.RawMessage, []string, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, nil, fmt.Errorf("protojson: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, fmt.Errorf("reparse protojson: %w", err)
	}
	var hit []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		if redactPath(v, strings.Split(p, ".")) && !slices.Contains(hit, p) {
			hit = append(hit, p)
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, nil, fmt.Errorf("encode redacted body: %w", err)
	}
	return out, hit, nil
}

// redactPath replaces the value at path below v; it reports whether any was
// present.
func redactPath(v any, path []string) bool {
	switch x := v.(type) {
	case []any:
		hit := false
		for _, e := range x {
			hit = redactPath(e, path) || hit
		}
		return hit
	case map[string]any:
		child, ok := x[path[0]]
		if !ok {
			return false
		}
		if len(path) == 1 {
			x[path[0]] = Redacted
			return true
		}
		return redactPath(child, path[1:])
	}
	return false
}
