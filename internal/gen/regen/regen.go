// Package regen lists every generated artifact committed to this repository
// and produces it in-process. The regen command writes the files; tests
// compare them with what is committed, so a stale generated file fails CI.
package regen

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/protosaga/saga/internal/gen/protoc"
)

// Module is the Go module path of this repository; generated Go files are
// written relative to it (the module= plugin option).
const Module = "github.com/protosaga/saga"

// Target is one set of .proto files compiled together.
type Target struct {
	// Name identifies the target in errors.
	Name string
	// Root is the import root relative to the repository root; generated
	// files are written relative to the repository root (module=).
	Root string
	// Files are the files to generate, relative to Root.
	Files []string
	// Saga says whether protoc-gen-saga runs too (protoc-gen-go always runs).
	Saga bool
}

// Targets are the committed generated artifacts.
func Targets() []Target {
	return []Target{
		{Name: "options", Root: "options", Files: []string{"saga/v1/saga.proto"}},
		// The progress record in protobuf, for bench's comparison with the
		// JSON the instance tables store.
		{Name: "progress", Root: "bench/internal", Files: []string{"progresspb/progress.proto"}},
		{Name: "placeorder", Root: "examples/placeorder", Saga: true, Files: []string{
			"shop/common/v1/common.proto",
			"shop/inventory/v1/inventory.proto",
			"shop/order/v1/order.proto",
			"shop/payment/v1/payment.proto",
			"shop/shipping/v1/shipping.proto",
		}},
		{Name: "quoteapproval", Root: "examples/quoteapproval", Saga: true, Files: []string{
			"approval/v1/approval.proto",
			"pricing/v1/pricing.proto",
			"quote/v1/quote.proto",
		}},
		{Name: "travel", Root: "examples/travel", Saga: true, Files: []string{
			"insurance/v1/insurance.proto",
			"payment/v1/payment.proto",
			"reservation/v1/reservation.proto",
			"traveller/v1/traveller.proto",
			"trip/v1/trip.proto",
		}},
		// Golden cases of the generator's tests (testdata/golden/<case>).
		{Name: "golden/proto2", Root: "testdata/golden/proto2", Saga: true, Files: []string{"legacy/v1/legacy.proto"}},
		{Name: "golden/editions", Root: "testdata/golden/editions", Saga: true, Files: []string{"ed/v1/ed.proto"}},
		{Name: "golden/collide", Root: "testdata/golden/collide", Saga: true, Files: []string{"message/message.proto"}},
		{Name: "golden/shadow", Root: "testdata/golden/shadow", Saga: true, Files: []string{
			"cfg/cfg.proto", "ctx/ctx.proto", "d/d.proto", "data/data.proto", "def/def.proto", "h/h.proto",
			"msg/msg.proto", "ok/ok.proto", "s/s.proto", "start/start.proto", "statusURL/statusURL.proto", "t/t.proto",
		}},
		{Name: "golden/choreo", Root: "testdata/golden/choreo", Saga: true, Files: []string{"signup/v1/signup.proto"}},
		{Name: "golden/noopts", Root: "testdata/golden/noopts", Saga: true, Files: []string{"plain/v1/plain.proto"}},
		{Name: "golden/shapes", Root: "testdata/golden/shapes", Saga: true, Files: []string{"activation/v1/activation.proto"}},
		{Name: "golden/child", Root: "testdata/golden/child", Saga: true, Files: []string{"booking/v1/booking.proto", "payment/v1/payment.proto"}},
	}
}

// Generate returns the generated files of t, keyed by path relative to the
// repository root.
func Generate(ctx context.Context, repo string, t Target) (map[string][]byte, error) {
	req, err := protoc.Request(ctx, protoc.Options{
		ImportPaths: []string{filepath.Join(repo, t.Root), filepath.Join(repo, "options")},
		Parameter:   "module=" + Module,
	}, t.Files...)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", t.Name, err)
	}
	resp, err := protoc.ProtocGenGo(req)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", t.Name, err)
	}
	out := protoc.Files(resp)
	if t.Saga {
		files, err := sagaFiles(req, os.Stderr)
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", t.Name, err)
		}
		maps.Copy(out, files)
	}
	return out, nil
}

// All regenerates every target under repo.
func All(ctx context.Context, repo string) error {
	for _, t := range Targets() {
		files, err := Generate(ctx, repo, t)
		if err != nil {
			return err
		}
		if err := protoc.Write(repo, files); err != nil {
			return fmt.Errorf("target %s: %w", t.Name, err)
		}
	}
	return nil
}
