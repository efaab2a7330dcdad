// Command regen regenerates every committed generated file of this
// repository in-process (protocompile + protoc-gen-go + protoc-gen-saga), so
// `make generate` needs neither protoc nor buf. It writes the same bytes
// `buf generate` with the repository's buf.gen.yaml writes.
//
// Usage, from the repository root:
//
//	go run ./internal/gen/cmd/regen
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/protosaga/saga/internal/gen/regen"
)

func main() {
	if err := regen.All(context.Background(), "."); err != nil {
		fmt.Fprintln(os.Stderr, "regen:", err)
		os.Exit(1)
	}
}
