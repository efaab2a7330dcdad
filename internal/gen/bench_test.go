package gen_test

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
	"github.com/protosaga/saga/internal/gen/synth"
)

// syntheticContract writes a contract of n files (see package synth) and
// returns its root and files.
func syntheticContract(t testing.TB, n int) (string, []string) {
	t.Helper()
	root := t.TempDir()
	files, err := synth.Write(root, n)
	require.NoError(t, err)
	return root, files
}

func syntheticRequest(b *testing.B, n int) *pluginpb.CodeGeneratorRequest {
	root, files := syntheticContract(b, n)
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{root, filepath.Join(repoRoot, "options")},
	}, files...)
	require.NoError(b, err)
	return req
}

// BenchmarkGenerate compares protoc-protoc-gen-saga with protoc-gen-go on a
// synthetic contract of 40 sagas and 560 annotated messages, run side by
// side in one benchmark so machine noise hits both; it reports the ratio of
// their times as "saga/go".
//
//	go test ./internal/gen -run '^$' -bench Generate -count 5
func BenchmarkGenerate(b *testing.B) {
	req := syntheticRequest(b, 40)
	var sagaTime, goTime time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		resp := gen.Response(req, io.Discard)
		sagaTime += time.Since(start)
		if resp.Error != nil {
			b.Fatal(resp.GetError())
		}
		start = time.Now()
		if _, err := protoc.ProtocGenGo(req); err != nil {
			b.Fatal(err)
		}
		goTime += time.Since(start)
	}
	b.ReportMetric(float64(sagaTime)/float64(goTime), "saga/go")
	b.ReportMetric(float64(sagaTime.Nanoseconds())/float64(b.N), "saga-ns/op")
	b.ReportMetric(float64(goTime.Nanoseconds())/float64(b.N), "go-ns/op")
}

// TestSyntheticContractGenerates keeps the benchmark's input valid.
func TestSyntheticContractGenerates(t *testing.T) {
	t.Parallel()
	root, files := syntheticContract(t, 2)
	got, resp := outcome(compile(t, root, "", files...))
	require.Nil(t, resp.Error, resp.GetError())
	require.Empty(t, got)
	require.NotEmpty(t, resp.File)
}
