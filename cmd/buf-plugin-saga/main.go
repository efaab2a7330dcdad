// Command buf-plugin-saga is a buf check plugin: it brings the saga
// contract's design review to `buf lint` and the changes that break sagas
// in flight to `buf breaking` (package internal/bufcheck,
// docs/design-review.md).
//
// buf runs it; list it in buf.yaml with the rules to use:
//
//	version: v2
//	lint:
//	  use: [STANDARD, SAGA]
//	breaking:
//	  use: [FILE, SAGA_BREAKING]
//	plugins:
//	  - plugin: buf-plugin-saga
package main

import (
	"buf.build/go/bufplugin/check"

	"github.com/protosaga/saga/internal/bufcheck"
)

func main() {
	check.Main(bufcheck.Spec())
}
