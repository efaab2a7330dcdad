// Command protoc-gen-saga generates typed saga code, SQL migrations,
// RabbitMQ topology and documentation from .proto contracts annotated with
// the saga.v1 options (options/saga/v1/saga.proto).
//
// Run it through buf or protoc:
//
//	protoc --saga_out=. --saga_opt=paths=source_relative contract.proto
//
// Parameters: protogen's paths=, module= and M<file>=<import path>, and
// warnings=error to fail generation on design-review warnings.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen"
)

// version is the plugin version; release builds set it with -ldflags.
var version = "devel"

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Fprintf(os.Stdout, "%v %v\n", filepath.Base(os.Args[0]), version)
		os.Exit(0)
	}
	if len(os.Args) == 2 && (os.Args[1] == "-h" || os.Args[1] == "--help") {
		fmt.Fprintln(os.Stdout, "protoc-gen-saga is a protoc plugin; run it through protoc or buf (see docs/generator.md).")
		os.Exit(0)
	}
	var params gen.Params
	flags := params.Flags()
	protogen.Options{ParamFunc: flags.Set}.Run(func(p *protogen.Plugin) error {
		return gen.Run(p, params, os.Stderr)
	})
}
