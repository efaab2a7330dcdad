package golang

import (
	"go/token"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
)

// locals names the local variables (receivers, parameters, variables) of
// the functions generated for one saga.
//
// protogen imports a package under the last element of its path, with
// digits appended when two imports of a file end alike. A contract package
// whose path ends in "data", "msg", "start", "h", "cfg", ... would be hidden
// by the local of that name in every function that also refers to the
// package, and the file would not compile ("data.Reserved is not a type").
// A local whose name a package of the saga can be imported under is given
// trailing underscores until it is free ("data_"). Locals never end in a
// digit, so the "data1" of a second package cannot clash either.
type locals map[string]bool

// sagaLocals returns the locals of saga s's functions in a file that may
// also import the packages more (the contract package, for the test
// helpers).
func sagaLocals(s *model.Saga, more ...protogen.GoImportPath) locals {
	l := locals{}
	add := func(ip protogen.GoImportPath) { l[importName(ip)] = true }
	add(s.Data.GoIdent.GoImportPath)
	for _, m := range msgUnion([]*model.Message{s.Start}, s.Commands, s.Handles) {
		add(m.Proto.GoIdent.GoImportPath)
	}
	for _, ip := range more {
		add(ip)
	}
	return l
}

// name returns the local variable called want, renamed when an import may
// take that name.
func (l locals) name(want string) string {
	for l[want] {
		want += "_"
	}
	return want
}

// importName is the name protogen gives an import of ip before it appends
// digits for a clash: the path's last element, made a Go identifier
// (protogen's cleanPackageName).
func importName(ip protogen.GoImportPath) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			return r
		}
		return '_'
	}, path.Base(string(ip)))
	if r, _ := utf8.DecodeRuneInString(s); token.Lookup(s).IsKeyword() || !unicode.IsLetter(r) {
		return "_" + s
	}
	return s
}
