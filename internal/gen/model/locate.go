package model

import (
	"cmp"
	"fmt"
	"slices"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sagav1 "github.com/protosaga/saga/options/saga/v1"
)

// Positions inside option literals.
//
// A finding names a source path (a message's option, a field of the option's
// message literal, a step's timeout). The compilers that run this plugin
// record different locations for the same source:
//
//   - protoc records the option statement (`option (saga.v1.saga) = {`), and
//     the statements of options set field by field
//     (`option (saga.v1.message).kind = KIND_COMMAND;`), but nothing inside a
//     message literal.
//   - buf (v1.75) records the fields inside a literal, except: the option
//     itself starts at its name, not at `option`; a singular message field
//     (`cancel: {...}`) has no location of its own, only its fields; an
//     element of a repeated message field (`steps: {...}`) has a location
//     but its fields have none; a list literal (`idempotency_key: ["a",
//     "b"]`) has one location, the whole entry, under index 0, and later
//     entries of the same field are numbered as if the list were one element.
//   - protocompile (the in-process compiler of the tests) records every
//     field, element and list value.
//
// locate reports the most specific location every compiler that records
// inside literals records the same way, so a finding points at the same
// line and column under buf and protocompile; under protoc it points at the
// option statement unless the option was set field by field.

// locate returns the position of path in f (see above), or of the nearest
// enclosing element that has one; 1:1 when the file has no source info.
func locate(f *protogen.File, path []int32) Pos {
	l := newLocator(f)
	if loc, ok := l.find(path); ok {
		return Pos{File: f.Desc.Path(), Line: loc.StartLine + 1, Col: loc.StartColumn + 1}
	}
	return Pos{File: f.Desc.Path(), Line: 1, Col: 1}
}

type locator struct {
	f      *protogen.File
	locs   []protoreflect.SourceLocation
	byPath map[string][]protoreflect.SourceLocation
}

func newLocator(f *protogen.File) *locator {
	sl := f.Desc.SourceLocations()
	l := &locator{f: f, byPath: map[string][]protoreflect.SourceLocation{}}
	for i := range sl.Len() {
		loc := sl.Get(i)
		l.locs = append(l.locs, loc)
		k := pathKey(loc.Path)
		l.byPath[k] = append(l.byPath[k], loc)
	}
	return l
}

func pathKey(p []int32) string { return fmt.Sprint(p) }

func (l *locator) exact(p []int32) (protoreflect.SourceLocation, bool) {
	if ls := l.byPath[pathKey(p)]; len(ls) > 0 {
		return ls[0], true
	}
	return protoreflect.SourceLocation{}, false
}

func (l *locator) find(path []int32) (protoreflect.SourceLocation, bool) {
	opt := l.option(path)
	// An option set field by field is a statement of its own, recorded alike
	// by every compiler (protoc included).
	if loc, ok := l.exact(path); ok && opt != nil && l.statement(opt.decl, loc) {
		return loc, true
	}
	stable := path
	if opt != nil {
		stable = opt.stable(l, path)
	}
	if len(stable) == len(path) {
		if loc, ok := l.exact(path); ok {
			return l.normalize(opt, path, loc), true
		}
	}
	if opt != nil {
		if loc, ok := l.firstDescendant(opt, path); ok {
			return loc, true
		}
	}
	for n := len(stable); n >= 0; n-- {
		q := stable[:n]
		if opt != nil && n > len(opt.decl)+2 && len(opt.stable(l, q)) != n {
			continue
		}
		if loc, ok := l.exact(q); ok {
			return l.normalize(opt, q, loc), true
		}
	}
	return protoreflect.SourceLocation{}, false
}

// normalize maps the location of an option ([decl, 7, ext]) to the start of
// its option statement: buf starts it at the option's name, protoc and
// protocompile at `option`.
func (l *locator) normalize(opt *optionPath, p []int32, loc protoreflect.SourceLocation) protoreflect.SourceLocation {
	if opt == nil || len(p) != len(opt.decl)+2 {
		return loc
	}
	best, found := loc, false
	for _, s := range l.byPath[pathKey(path(opt.decl, fieldMessageOptions))] {
		if contains(s, loc) && (!found || before(best, s)) {
			best, found = s, true
		}
	}
	return best
}

// statement reports whether loc spans a whole option statement of decl.
func (l *locator) statement(decl []int32, loc protoreflect.SourceLocation) bool {
	for _, s := range l.byPath[pathKey(path(decl, fieldMessageOptions))] {
		if s.StartLine == loc.StartLine && s.StartColumn == loc.StartColumn &&
			s.EndLine == loc.EndLine && s.EndColumn == loc.EndColumn {
			return true
		}
	}
	return false
}

// firstDescendant returns the earliest location below p that every compiler
// records alike: a field of a singular message literal (`cancel: {...}`),
// or an option statement setting a field of the option.
func (l *locator) firstDescendant(opt *optionPath, p []int32) (protoreflect.SourceLocation, bool) {
	var best protoreflect.SourceLocation
	found := false
	for _, loc := range l.locs {
		d := loc.Path
		if len(d) <= len(p) || !slices.Equal(d[:len(p)], p) {
			continue
		}
		if len(opt.stable(l, d)) != len(d) && !l.statement(opt.decl, loc) {
			continue
		}
		if !found || before(loc, best) {
			best, found = loc, true
		}
	}
	return best, found
}

func before(a, b protoreflect.SourceLocation) bool {
	return cmp.Or(cmp.Compare(a.StartLine, b.StartLine), cmp.Compare(a.StartColumn, b.StartColumn)) < 0
}

// contains reports whether outer's span contains inner's start.
func contains(outer, inner protoreflect.SourceLocation) bool {
	startsBefore := outer.StartLine < inner.StartLine ||
		(outer.StartLine == inner.StartLine && outer.StartColumn <= inner.StartColumn)
	endsAfter := outer.EndLine > inner.StartLine ||
		(outer.EndLine == inner.StartLine && outer.EndColumn > inner.StartColumn)
	return startsBefore && endsAfter
}

// optionPath is a source path into a saga.v1 option of a message:
// [4, i, (3, j)*, 7, ext, ...].
type optionPath struct {
	decl []int32 // the message declaration's path
	// value is the option's message literal, as decoded.
	value protoreflect.Message
}

// option returns p's option, or nil when p is not inside a saga.v1 option.
func (l *locator) option(p []int32) *optionPath {
	if len(p) < 2 || p[0] != 4 {
		return nil
	}
	msgs := l.f.Desc.Messages()
	var md protoreflect.MessageDescriptor
	i := 0
	for {
		if i+1 >= len(p) || int(p[i+1]) >= msgs.Len() || p[i+1] < 0 {
			return nil
		}
		md = msgs.Get(int(p[i+1]))
		i += 2
		if i < len(p) && p[i] == 3 {
			msgs = md.Messages()
			continue
		}
		break
	}
	if i+1 >= len(p) || p[i] != fieldMessageOptions {
		return nil
	}
	opts := md.Options()
	var value proto.Message
	switch p[i+1] {
	case extMessage:
		if !proto.HasExtension(opts, sagav1.E_Message) {
			return nil
		}
		value, _ = proto.GetExtension(opts, sagav1.E_Message).(*sagav1.Message)
	case extSaga:
		if !proto.HasExtension(opts, sagav1.E_Saga) {
			return nil
		}
		value, _ = proto.GetExtension(opts, sagav1.E_Saga).(*sagav1.Saga)
	default:
		return nil
	}
	if value == nil {
		return nil
	}
	return &optionPath{decl: slices.Clone(p[:i]), value: value.ProtoReflect()}
}

// stable returns the longest prefix of p (a path into o's option) that
// buf and protocompile both record, and record alike:
//   - an element of a repeated message field, when the locations of its
//     elements are as many as the elements (a list literal under buf is
//     not), but none of its fields;
//   - no element of a repeated scalar field (a list literal's values under
//     protocompile, its whole entry under buf): their message literal;
//   - not a singular message field itself, only its fields.
func (o *optionPath) stable(l *locator, p []int32) []int32 {
	i := len(o.decl) + 2
	if len(p) <= i {
		return p
	}
	v := o.value
	for i < len(p) {
		fd := v.Descriptor().Fields().ByNumber(protoreflect.FieldNumber(p[i]))
		switch {
		case fd == nil:
			return p[:i]
		case fd.IsList():
			if fd.Message() == nil || i+1 >= len(p) {
				return p[:i]
			}
			n := v.Get(fd).List().Len()
			if l.elements(p[:i+1]) != n || int(p[i+1]) >= n {
				return p[:i]
			}
			return p[:i+2]
		case fd.Message() != nil:
			if i+1 == len(p) {
				return p[:i]
			}
			v = v.Get(fd).Message()
			i++
		default:
			return p[:i+1]
		}
	}
	return p
}

// elements counts the distinct element indexes located under the repeated
// field at p.
func (l *locator) elements(p []int32) int {
	seen := map[int32]bool{}
	for _, loc := range l.locs {
		d := loc.Path
		if len(d) == len(p)+1 && slices.Equal(d[:len(p)], p) {
			seen[d[len(p)]] = true
		}
	}
	return len(seen)
}
