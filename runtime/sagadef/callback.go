package sagadef

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
)

// Callback declares which outcomes of a saga are delivered to a client over
// HTTP (package callback) and where. The zero value declares none.
type Callback struct {
	// States are the states whose reaching is delivered: any of
	// StateCompleted, StateFailed, StateCancelled and StateManualReview.
	// Empty: no callbacks.
	States []string
	// URLField is the field path, in the saga data message, of the callback
	// URL the request registered. A saga whose field is empty sends none.
	URLField string
	// ClientField is the field path, in the saga data message, of the
	// client id whose registered endpoint receives the callback (the
	// dispatcher's Clients). Exactly one of URLField and ClientField is set.
	ClientField string
	// IncludeData adds the saga data, as protobuf JSON, to the payload.
	IncludeData bool
}

// Declared reports whether c declares callbacks.
func (c Callback) Declared() bool { return len(c.States) > 0 }

// Delivers reports whether reaching state sends a callback.
func (c Callback) Delivers(state string) bool { return slices.Contains(c.States, state) }

// Target returns the callback URL or client id the saga data names ("" for
// none).
func (c Callback) Target(data proto.Message) (url, client string) {
	if data == nil {
		return "", ""
	}
	r := data.ProtoReflect()
	return fieldText(r, c.URLField), fieldText(r, c.ClientField)
}

// validateCallback checks c's shape; field paths are checked by the
// generator's design review against the data message.
func validateCallback(c Callback) error {
	if !c.Declared() {
		if c.URLField != "" || c.ClientField != "" || c.IncludeData {
			return fmt.Errorf("callback: no states to deliver")
		}
		return nil
	}
	if (c.URLField == "") == (c.ClientField == "") {
		return fmt.Errorf("callback: want exactly one of URLField and ClientField, got %q and %q", c.URLField, c.ClientField)
	}
	for i, s := range c.States {
		switch s {
		case StateCompleted, StateFailed, StateCancelled, StateManualReview:
		default:
			return fmt.Errorf("callback: state %q cannot be delivered (want COMPLETED, FAILED, CANCELLED or MANUAL_REVIEW)", s)
		}
		if slices.Contains(c.States[:i], s) {
			return fmt.Errorf("callback: state %q listed twice", s)
		}
	}
	return nil
}
