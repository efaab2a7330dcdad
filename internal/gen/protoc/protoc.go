// Package protoc runs the protobuf toolchain in-process: it compiles .proto
// sources into a CodeGeneratorRequest with github.com/bufbuild/protocompile
// (no protoc or buf binary needed), runs protoc-gen-go's generator on it, and
// writes a CodeGeneratorResponse to disk.
//
// Tests and the regen program use it so that golden files and committed
// generated code are produced exactly as `buf generate` would, without
// external tools. The request is marshalled and unmarshalled once, like a
// real plugin invocation, so options are decoded by the plugin's own
// extension registry.
package protoc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/linker"
	"google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// SourceInfo is the source-info mode used for compilation: standard
// locations plus locations inside option message literals, as buf produces.
const SourceInfo = protocompile.SourceInfoStandard | protocompile.SourceInfoExtraOptionLocations

// Options configure [Request].
type Options struct {
	// ImportPaths are the directories .proto imports resolve against.
	ImportPaths []string
	// Parameter is the plugin parameter string (e.g. "paths=source_relative").
	Parameter string
	// SourceInfo overrides the source-info mode; zero means [SourceInfo].
	SourceInfo protocompile.SourceInfoMode
}

// Request compiles files (paths relative to an import path) and returns the
// CodeGeneratorRequest a plugin would receive for them: every transitive
// dependency in topological order, files to generate in the order given.
func Request(ctx context.Context, opts Options, files ...string) (*pluginpb.CodeGeneratorRequest, error) {
	if len(files) == 0 {
		return nil, errors.New("compile protos: no files")
	}
	mode := opts.SourceInfo
	if mode == 0 {
		mode = SourceInfo
	}
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: opts.ImportPaths,
		}),
		SourceInfoMode: mode,
	}
	compiled, err := c.Compile(ctx, files...)
	if err != nil {
		return nil, fmt.Errorf("compile protos: %w", err)
	}
	var ordered []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var visit func(fd protoreflect.FileDescriptor)
	visit = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imps := fd.Imports()
		for i := range imps.Len() {
			visit(imps.Get(i).FileDescriptor)
		}
		ordered = append(ordered, toProto(fd))
	}
	for _, f := range compiled {
		visit(f)
	}
	param := opts.Parameter
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: files,
		ProtoFile:      ordered,
	}
	if param != "" {
		req.Parameter = proto.String(param)
	}
	// Round-trip through the wire format like a real plugin invocation, so
	// custom options are decoded by this binary's extension registry.
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("marshal code generator request: %w", err)
	}
	out := &pluginpb.CodeGeneratorRequest{}
	if err := proto.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("unmarshal code generator request: %w", err)
	}
	return out, nil
}

func toProto(fd protoreflect.FileDescriptor) *descriptorpb.FileDescriptorProto {
	if r, ok := fd.(linker.Result); ok {
		return r.FileDescriptorProto()
	}
	return protodesc.ToFileDescriptorProto(fd)
}

// WithParameter returns a copy of req with its parameter replaced.
func WithParameter(req *pluginpb.CodeGeneratorRequest, param string) *pluginpb.CodeGeneratorRequest {
	out := proto.Clone(req).(*pluginpb.CodeGeneratorRequest)
	if param == "" {
		out.Parameter = nil
	} else {
		out.Parameter = proto.String(param)
	}
	return out
}

// ProtocGenGo runs protoc-gen-go's generator in-process on req, exactly as
// the protoc-gen-go binary of the linked protobuf module version would.
func ProtocGenGo(req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, error) {
	gen, err := protogen.Options{}.New(req)
	if err != nil {
		return nil, fmt.Errorf("protoc-gen-go: %w", err)
	}
	for _, f := range gen.Files {
		if f.Generate {
			internal_gengo.GenerateFile(gen, f)
		}
	}
	gen.SupportedFeatures = internal_gengo.SupportedFeatures
	gen.SupportedEditionsMinimum = internal_gengo.SupportedEditionsMinimum
	gen.SupportedEditionsMaximum = internal_gengo.SupportedEditionsMaximum
	resp := gen.Response()
	if resp.Error != nil {
		return nil, fmt.Errorf("protoc-gen-go: %s", resp.GetError())
	}
	return resp, nil
}

// Files returns the response's files as a map from name to content.
func Files(resp *pluginpb.CodeGeneratorResponse) map[string][]byte {
	out := make(map[string][]byte, len(resp.File))
	for _, f := range resp.File {
		out[f.GetName()] = []byte(f.GetContent())
	}
	return out
}

// Write writes files under dir, creating directories as needed, in sorted
// order.
func Write(dir string, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", n, err)
		}
		if err := os.WriteFile(p, files[n], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", n, err)
		}
	}
	return nil
}
