// Package browsertest starts a headless Chromium for tests of the web
// console (package runtime/admin) and of walkthroughs that use it.
package browsertest

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

var (
	chromiumOnce sync.Once
	chromiumPath string
	chromiumErr  string
)

// findChromium returns the path of a Chromium (or Chrome) binary: $CHROMIUM,
// else the usual names on PATH. Under CI=true, running as root, it installs
// Debian's chromium package when none is found. It returns "" and why when
// there is none.
func findChromium() (string, string) {
	chromiumOnce.Do(func() {
		look := func() string {
			if p := os.Getenv("CHROMIUM"); p != "" {
				return p
			}
			for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
				if p, err := exec.LookPath(name); err == nil {
					return p
				}
			}
			return ""
		}
		if chromiumPath = look(); chromiumPath != "" {
			return
		}
		if os.Getenv("CI") != "true" || os.Geteuid() != 0 {
			chromiumErr = "no chromium on PATH (install Debian's package: apt-get install -y chromium)"
			return
		}
		var out strings.Builder
		for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "chromium"}} {
			cmd := exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				chromiumErr = "apt-get " + strings.Join(args, " ") + ": " + err.Error() + "\n" + out.String()
				return
			}
		}
		if chromiumPath = look(); chromiumPath == "" {
			chromiumErr = "chromium installed but not found on PATH"
		}
	})
	return chromiumPath, chromiumErr
}

// New returns a chromedp context on a fresh headless Chromium (window
// 1400×1000) that lives until the test ends. The test is skipped when there
// is no Chromium, except under CI=true, where that is a failure.
func New(t testing.TB) context.Context {
	t.Helper()
	path, why := findChromium()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("browser test needs Chromium under CI: %s", why)
		}
		t.Skipf("browser test skipped: %s", why)
	}
	// A fresh profile per test. Not t.TempDir: Chromium's helper processes
	// may still write into it for a moment after the browser exits.
	profile, err := os.MkdirTemp("", "saga-console-chromium-")
	if err != nil {
		t.Fatalf("browsertest: chromium profile: %v", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000),
		chromedp.WSURLReadTimeout(90 * time.Second), // a loaded machine starts Chromium slowly
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// chromedp reports DOM events it has no handler for (the top layer of
	// an open <dialog>) as errors; they are not the page's.
	ctx, cancelCtx := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(format string, args ...any) {
		if msg := fmt.Sprintf(format, args...); !strings.Contains(msg, "unhandled node event") {
			log.Printf("chromedp: %s", msg) // not t.Logf: chromedp may report after the test ended
		}
	}))
	ctx, cancelTimeout := context.WithTimeout(ctx, 5*time.Minute) // a loaded machine is slow; every wait has its own bound
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("could not remove chromium profile %s", profile)
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("browsertest: start chromium %s: %v", path, err)
	}
	return ctx
}
