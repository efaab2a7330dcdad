package sagadef

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/protosaga/saga/runtime/message"
)

// CancelRequest returns who asked for a cancel and why: the values of the
// cancel message's RequestedBy and Reason fields (Definition.Cancel). A
// field path the message does not have, or an unset field, gives "". A
// string is returned as it is, any other scalar in its text form (an enum
// by its value name).
func (d *Definition) CancelRequest(m message.Message) (requestedBy, reason string) {
	if m == nil {
		return "", ""
	}
	r := m.ProtoReflect()
	return fieldText(r, d.Cancel.RequestedBy), fieldText(r, d.Cancel.Reason)
}

// fieldText returns the text of the scalar at path (field names joined
// with dots) in m, or "" when there is none.
func fieldText(m protoreflect.Message, path string) string {
	if path == "" || m == nil || !m.IsValid() {
		return ""
	}
	parts := strings.Split(path, ".")
	for i, name := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.IsList() || fd.IsMap() {
			return ""
		}
		if i < len(parts)-1 {
			if fd.Message() == nil || !m.Has(fd) {
				return ""
			}
			m = m.Get(fd).Message()
			continue
		}
		v := m.Get(fd)
		switch fd.Kind() {
		case protoreflect.StringKind:
			return strings.TrimSpace(v.String())
		case protoreflect.EnumKind:
			if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
				return string(ev.Name())
			}
			return fmt.Sprint(int32(v.Enum()))
		case protoreflect.MessageKind, protoreflect.GroupKind, protoreflect.BytesKind:
			return ""
		default:
			return fmt.Sprint(v.Interface())
		}
	}
	return ""
}
