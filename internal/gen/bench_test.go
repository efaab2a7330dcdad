package gen_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
)

// syntheticContract writes a contract of n files, each with one saga of
// four steps (a compensatable step, a pivot, two retriable steps: 13
// annotated messages and a data message), and returns its root and files.
func syntheticContract(t testing.TB, n int) (string, []string) {
	t.Helper()
	root := t.TempDir()
	var files []string
	for i := range n {
		pkg := fmt.Sprintf("synth.s%03d.v1", i)
		var b strings.Builder
		fmt.Fprintf(&b, "syntax = \"proto3\";\npackage %s;\nimport \"saga/v1/saga.proto\";\n", pkg)
		fmt.Fprintf(&b, "option go_package = \"example.com/synth/s%03d/v1;s%03dv1\";\n", i, i)
		msg := func(name, opt string) {
			fmt.Fprintf(&b, "message %s {\n  option (saga.v1.message) = {%s};\n  string id = 1;\n  int64 amount = 2;\n  repeated string tags = 3;\n}\n", name, opt)
		}
		cmd := func(name string) {
			msg(name, `kind: KIND_COMMAND, owner: "svc", idempotency_key: ["id"], correlation_field: "id"`)
		}
		reply := func(name string) { msg(name, `kind: KIND_REPLY, correlation_field: "id"`) }
		msg("Begin", `kind: KIND_COMMAND, idempotency_key: ["id"]`)
		for _, s := range []string{"Reserve", "Charge", "Ship", "Notify"} {
			cmd(s)
			reply(s + "Done")
		}
		reply("ReserveFailed")
		reply("ChargeFailed")
		cmd("Release")
		reply("Released")
		step := func(name, role, extra string) string {
			return fmt.Sprintf(`steps: {role: %s command: %q success: "%sDone" timeout: "10s" late_reply: LATE_REPLY_IGNORE %s}`, role, name, name, extra)
		}
		fmt.Fprintf(&b, "message FlowData {\n  option (saga.v1.saga) = {name: \"Flow%03d\" start: \"Begin\" business_key: \"id\" service: \"svc\" deadline: \"1h\"\n%s\n%s\n%s\n%s\n};\n  string id = 1;\n}\n", i,
			step("Reserve", "ROLE_COMPENSATABLE", `failure: "ReserveFailed" compensation: "Release" compensation_reply: "Released"`),
			step("Charge", "ROLE_PIVOT", `failure: "ChargeFailed"`),
			step("Ship", "ROLE_RETRIABLE", `max_attempts: 3`),
			step("Notify", "ROLE_RETRIABLE", `max_attempts: 3`))
		name := fmt.Sprintf("s%03d/flow.proto", i)
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(b.String()), 0o644))
		files = append(files, name)
	}
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
