// Package tools pins buf as a Go tool dependency, in a module of its own so
// it never enters the main module's dependency graph: a program importing
// only the runtime pulls no build tooling.
//
//	go -C tools tool buf generate ..   # or build it once into .cache/bin
//
// protoc-gen-go is deliberately not pinned here: buf v1.75.0 requires a newer
// google.golang.org/protobuf than v1.36.12, and one module holds one version
// of a module. protoc-gen-go is built from the main module instead
// (go build -o .cache/bin/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go),
// which is exactly the protobuf version the runtime links and the in-process
// regen (internal/gen/cmd/regen) runs, so `buf generate` and regen write the
// same bytes (protoc-gen-go stamps its version into every .pb.go).
package tools
