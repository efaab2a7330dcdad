package regen

import (
	"google.golang.org/protobuf/types/pluginpb"
)

func sagaFiles(req *pluginpb.CodeGeneratorRequest) (map[string][]byte, error) {
	return nil, nil
}
