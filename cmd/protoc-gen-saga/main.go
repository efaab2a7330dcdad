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
//
// It also writes the saga.v1 options into a proto tree, for a buf workspace
// to list as a module (docs/options.md):
//
//	protoc-gen-saga export-options [-force] DIR
//
// writes DIR/saga/v1/saga.proto, the options this binary was built with.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/options"
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
		fmt.Fprintln(os.Stdout, "protoc-gen-saga export-options [-force] DIR writes the saga.v1 options to DIR/saga/v1/saga.proto (see docs/options.md).")
		os.Exit(0)
	}
	if len(os.Args) >= 2 && os.Args[1] == "export-options" {
		err := exportOptions(os.Args[2:], os.Stdout, os.Stderr)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s export-options: %v\n", filepath.Base(os.Args[0]), err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := run(os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		os.Exit(1)
	}
}

// run reads a CodeGeneratorRequest from in and writes the response to out.
// Generation errors travel in the response, as protoc and buf expect; only
// a request that cannot be read or a response that cannot be written is an
// error here.
func run(in io.Reader, out, warn io.Writer) error {
	b, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read the code generator request: %w", err)
	}
	req := &pluginpb.CodeGeneratorRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return fmt.Errorf("decode the code generator request (is this run by protoc or buf?): %w", err)
	}
	b, err = proto.Marshal(gen.Response(req, warn))
	if err != nil {
		return fmt.Errorf("encode the code generator response: %w", err)
	}
	if _, err := out.Write(b); err != nil {
		return fmt.Errorf("write the code generator response: %w", err)
	}
	return nil
}

// exportOptions runs `protoc-gen-saga export-options [-force] DIR`.
func exportOptions(args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("export-options", flag.ContinueOnError)
	fs.SetOutput(errOut)
	force := fs.Bool("force", false, "replace files that differ from the options of this binary")
	fs.Usage = func() {
		fmt.Fprintln(errOut, "usage: protoc-gen-saga export-options [-force] DIR")
		fmt.Fprintln(errOut, "Writes the saga.v1 options to DIR/saga/v1/saga.proto; DIR is an import root (a buf module or protoc -I).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 2 && fs.Arg(1) == "-force" { // the flag after the directory
		*force = true
		args = fs.Args()[:1]
		if err := fs.Parse(args); err != nil {
			return err
		}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("want exactly one directory")
	}
	written, err := options.Export(fs.Arg(0), *force)
	if err != nil {
		return err
	}
	for _, w := range written {
		fmt.Fprintf(out, "%s: %s\n", w.Path, w.Outcome)
	}
	return nil
}
