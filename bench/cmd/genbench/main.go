// Command genbench measures protoc-gen-saga's generation time against
// protoc-gen-go on the same synthetic contract, in one process and one run, so
// machine noise hits both alike. Both generators run in-process on the same
// CodeGeneratorRequest (compiled once with protocompile), interleaved run by
// run; the report gives medians, min–max and the ratio saga/go.
//
//	cd bench && go run ./cmd/genbench -sagas 40 -runs 9
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/protosaga/saga/internal/gen"
	"github.com/protosaga/saga/internal/gen/protoc"
	"github.com/protosaga/saga/internal/gen/synth"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "genbench:", err)
		os.Exit(1)
	}
}

func run() error {
	sagas := flag.Int("sagas", 40, "synthetic sagas (one file and 14 annotated messages each)")
	runs := flag.Int("runs", 9, "measured runs of each generator (after one warm-up)")
	repo := flag.String("repo", "..", "repository root (for options/saga/v1/saga.proto)")
	flag.Parse()
	if *sagas < 1 || *runs < 1 {
		return fmt.Errorf("-sagas and -runs must be at least 1")
	}

	root, err := os.MkdirTemp("", "genbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	files, err := synth.Write(root, *sagas)
	if err != nil {
		return err
	}
	req, err := protoc.Request(context.Background(), protoc.Options{
		ImportPaths: []string{root, filepath.Join(*repo, "options")},
	}, files...)
	if err != nil {
		return fmt.Errorf("compile synthetic contract: %w", err)
	}

	sagaGen := func() (int, error) {
		resp := gen.Response(req, io.Discard)
		if resp.Error != nil {
			return 0, fmt.Errorf("protoc-gen-saga: %s", resp.GetError())
		}
		return len(resp.File), nil
	}
	goGen := func() (int, error) {
		resp, err := protoc.ProtocGenGo(req)
		if err != nil {
			return 0, fmt.Errorf("protoc-gen-go: %w", err)
		}
		return len(resp.File), nil
	}

	var sagaRes, goRes result
	for i := 0; i <= *runs; i++ {
		s, err := measure(sagaGen)
		if err != nil {
			return err
		}
		g, err := measure(goGen)
		if err != nil {
			return err
		}
		if i == 0 {
			sagaRes.files, goRes.files = s.files, g.files
			continue // warm-up
		}
		sagaRes.add(s)
		goRes.add(g)
	}

	fmt.Printf("synthetic contract: %d files, %d sagas, %d annotated messages; %d runs after 1 warm-up; GOMAXPROCS=%d\n\n",
		len(files), *sagas, *sagas*synth.MessagesPerSaga, *runs, runtime.GOMAXPROCS(0))
	fmt.Printf("%-16s %8s %12s %18s %14s\n", "generator", "files", "median ms", "min–max ms", "alloc MB/run")
	for _, r := range []struct {
		name string
		res  result
	}{{"protoc-gen-go", goRes}, {"protoc-gen-saga", sagaRes}} {
		lo, hi := r.res.span()
		fmt.Printf("%-16s %8d %12.1f %18s %14.1f\n", r.name, r.res.files, ms(r.res.median()), fmt.Sprintf("%.1f–%.1f", ms(lo), ms(hi)), r.res.allocMB())
	}
	ratios := make([]float64, len(sagaRes.times))
	for i := range ratios {
		ratios[i] = float64(sagaRes.times[i]) / float64(goRes.times[i])
	}
	slices.Sort(ratios)
	fmt.Printf("\nratio saga/go (per run, paired): median %.2f, min %.2f, max %.2f\n", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	return nil
}

type sample struct {
	d     time.Duration
	alloc uint64
	files int
}

func measure(f func() (int, error)) (sample, error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	n, err := f()
	d := time.Since(start)
	runtime.ReadMemStats(&after)
	return sample{d: d, alloc: after.TotalAlloc - before.TotalAlloc, files: n}, err
}

type result struct {
	times []time.Duration
	alloc uint64
	files int
}

func (r *result) add(s sample) { r.times = append(r.times, s.d); r.alloc += s.alloc }

func (r *result) median() time.Duration {
	t := slices.Sorted(slices.Values(r.times))
	return t[len(t)/2]
}

func (r *result) span() (time.Duration, time.Duration) {
	return slices.Min(r.times), slices.Max(r.times)
}

func (r *result) allocMB() float64 { return float64(r.alloc) / float64(len(r.times)) / (1 << 20) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
