package regen

import (
	"errors"
	"io"

	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
)

func sagaFiles(req *pluginpb.CodeGeneratorRequest, warn io.Writer) (map[string][]byte, error) {
	resp := gen.Response(req, warn)
	if resp.Error != nil {
		return nil, errors.New(resp.GetError())
	}
	return protoc.Files(resp), nil
}
