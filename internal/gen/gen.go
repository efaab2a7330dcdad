// Package gen is protoc-gen-saga: it reads a plugin request into one
// reviewed model (package model) and renders every artifact from it (Go
// through package golang, SQL, Markdown and BPMN through package text,
// Grafana dashboards through runtime/telemetry/dashboard).
//
// Nothing is written unless the whole design review passes: [Run] returns
// every finding at once, and protogen then sends an error response with no
// files.
package gen

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen/golang"
	"github.com/protosaga/saga/internal/gen/model"
	"github.com/protosaga/saga/internal/gen/text"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry/dashboard"
)

// Params are the plugin parameters protoc-gen-saga accepts (besides
// protogen's own paths=, module= and M...).
type Params struct {
	// Warnings is "error" to promote design-review warnings to errors, or
	// "warn" (also when empty) to print them.
	Warnings string
}

// accepted lists every parameter, for error messages.
const accepted = "paths=import|source_relative, module=<prefix>, M<file>=<import path>, warnings=error|warn"

// Flags returns a flag set binding p. Use [Params.Set] as
// protogen.Options.ParamFunc: its errors name the plugin and the parameter.
func (p *Params) Flags() *flag.FlagSet {
	fs := flag.NewFlagSet("protoc-gen-saga", flag.ContinueOnError)
	fs.Func("warnings", `"error" promotes design-review warnings to errors; "warn" prints them`, func(v string) error {
		if err := checkWarnings(v); err != nil {
			return err
		}
		p.Warnings = v
		return nil
	})
	return fs
}

// Set binds the plugin parameter name=value to p (protogen.Options.ParamFunc
// passes it every parameter protogen does not handle itself).
func (p *Params) Set(name, value string) error {
	fs := p.Flags()
	if fs.Lookup(name) == nil {
		return fmt.Errorf("protoc-gen-saga: unknown parameter %q; accepted: %s", name, accepted)
	}
	if err := fs.Set(name, value); err != nil {
		return fmt.Errorf("protoc-gen-saga: parameter %s=%q: %w", name, value, err)
	}
	return nil
}

// checkWarnings validates the value of the warnings parameter. An empty
// value is refused: "warnings" alone reads like "warnings on", which is
// what happens without it.
func checkWarnings(v string) error {
	switch v {
	case "error", "warn":
		return nil
	}
	return errors.New(`want warnings=error (fail on design-review warnings) or warnings=warn (print them; the default)`)
}

// normalizeParameter removes the spaces around each comma-separated
// parameter, so "Ma.proto=x, warnings=error" means what it reads as. It is
// applied before protogen reads the parameter, so its own parameters
// (paths=, module=, M...) and ours are read alike.
func normalizeParameter(param string) string {
	parts := strings.Split(param, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return strings.Join(parts, ",")
}

// Configure declares the plugin's supported features on gen.
func Configure(gen *protogen.Plugin) {
	gen.SupportedFeatures = uint64(pluginpb.CodeGeneratorResponse_FEATURE_PROTO3_OPTIONAL |
		pluginpb.CodeGeneratorResponse_FEATURE_SUPPORTS_EDITIONS)
	gen.SupportedEditionsMinimum = descriptorpb.Edition_EDITION_PROTO2
	gen.SupportedEditionsMaximum = descriptorpb.Edition_EDITION_2023
}

// Run generates every artifact for gen's request. Warnings are written to
// warn (protoc and buf show a plugin's stderr).
func Run(gen *protogen.Plugin, p Params, warn io.Writer) error {
	Configure(gen)
	if p.Warnings != "" {
		if err := checkWarnings(p.Warnings); err != nil {
			return fmt.Errorf("protoc-gen-saga: parameter warnings=%q: %w", p.Warnings, err)
		}
	}
	m, err := model.Build(gen, model.Options{WarningsAsErrors: p.Warnings == "error"})
	if err != nil {
		return err
	}
	for _, w := range m.Warnings {
		fmt.Fprintln(warn, w.Error())
	}
	r, err := text.New()
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range m.Files {
		dir := path.Dir(f.Proto.GeneratedFilenamePrefix)
		migrations := map[*model.Saga][]string{}
		for _, s := range f.Sagas {
			files, err := r.Migrations(s)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, tf := range files {
				migrations[s] = append(migrations[s], tf.Name)
				write(gen, path.Join(dir, tf.Name), tf.Content)
			}
			doc, err := r.Doc(s)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			write(gen, path.Join(dir, s.Snake+".saga.md"), doc)
			process, err := r.BPMN(s)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			write(gen, path.Join(dir, s.Snake+".saga.bpmn"), process)
			dash, err := dashboard.Build([]*sagadef.Definition{s.Definition}, dashboard.Options{Title: "Saga " + s.FullName})
			if err != nil {
				errs = append(errs, fmt.Errorf("dashboard of saga %s: %w", s.FullName, err))
				continue
			}
			write(gen, path.Join(dir, s.Snake+".dashboard.json"), dash)
		}
		golang.File(gen, f, migrations)
		golang.TestHelpers(gen, f)
		golang.ScenarioTests(gen, f)
		if f.Package.Files[0] == f {
			js, err := golang.Topology(f.Package).Broker().DefinitionsJSON()
			if err != nil {
				errs = append(errs, fmt.Errorf("topology of %s: %w", f.Package.ImportPath, err))
				continue
			}
			write(gen, path.Join(dir, "topology.saga.json"), append(js, '\n'))
		}
	}
	return errors.Join(errs...)
}

func write(gen *protogen.Plugin, name string, content []byte) {
	g := gen.NewGeneratedFile(name, "")
	_, _ = g.Write(content)
}

// Response runs the plugin on req in-process, exactly as the
// protoc-gen-saga binary does with a request on stdin, and returns the
// response (its Error set when generation failed). It removes the spaces
// around the request's comma-separated parameters in place.
func Response(req *pluginpb.CodeGeneratorRequest, warn io.Writer) *pluginpb.CodeGeneratorResponse {
	if req.Parameter != nil {
		req.Parameter = proto.String(normalizeParameter(req.GetParameter()))
	}
	if err := checkGoPackages(req); err != nil {
		return &pluginpb.CodeGeneratorResponse{Error: proto.String(err.Error())}
	}
	var params Params
	plugin, err := protogen.Options{ParamFunc: params.Set}.New(req)
	if err != nil {
		return &pluginpb.CodeGeneratorResponse{Error: proto.String(err.Error())}
	}
	if err := Run(plugin, params, warn); err != nil {
		plugin.Error(err)
	}
	resp := plugin.Response()
	if resp.Error != nil {
		return resp
	}
	names := packageNames(plugin)
	for _, f := range resp.File {
		if !strings.HasSuffix(f.GetName(), ".go") {
			continue
		}
		f.Content = proto.String(string(readableImports([]byte(f.GetContent()), names)))
	}
	return resp
}
