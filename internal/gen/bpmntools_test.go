package gen_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// bpmnToolsDir holds the npm packages the BPMN checks use (package.json and
// its lockfile; scripts/ensure-tools.sh installs them with npm ci).
const bpmnToolsDir = repoRoot + "/tools/bpmn"

// needTool fails the test under CI=true and skips it otherwise.
func needTool(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	msg := what + " is missing: run scripts/ensure-tools.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// bpmnTools returns node and the tools directory with its packages installed.
func bpmnTools(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	needTool(t, err == nil, "node")
	dir, err = filepath.Abs(bpmnToolsDir)
	require.NoError(t, err)
	for _, pkg := range []string{"bpmn-moddle", "bpmn-js"} {
		_, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json"))
		needTool(t, err == nil, "the npm package "+pkg+" in tools/bpmn")
	}
	return node, dir
}

// TestBPMNValidates reads every committed .bpmn file with bpmn-moddle (the
// BPMN 2.0 meta-model bpmn.io and Camunda Modeler read files with): no
// warning (unknown element or attribute, unresolved reference), every flow
// element and artifact drawn, and the model writes back.
func TestBPMNValidates(t *testing.T) {
	t.Parallel()
	files := committedBPMN(t)
	node, dir := bpmnTools(t)
	args := []string{"validate.mjs"}
	for _, f := range files {
		abs, err := filepath.Abs(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		args = append(args, abs)
	}
	cmd := exec.Command(node, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	require.NoError(t, err, "node validate.mjs: %s", out)
	var n int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r struct {
			File                      string
			Warnings, Undrawn         []string
			Elements, DiagramElements int
			Writes                    bool
			Error                     string
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "%s", sc.Text())
		require.Empty(t, r.Error, r.File)
		require.Empty(t, r.Warnings, r.File)
		require.Empty(t, r.Undrawn, r.File)
		require.Positive(t, r.Elements, r.File)
		require.Equal(t, r.Elements, r.DiagramElements, "%s: diagram elements that draw nothing of the process", r.File)
		require.True(t, r.Writes, r.File)
		n++
	}
	require.Equal(t, len(files), n)
}

// renderPage imports each file into a bpmn-js viewer and reports, per file,
// the import's warnings and how many diagram elements it drew.
const renderPage = `<!doctype html>
<html><head><meta charset="utf-8"><link rel="stylesheet" href="/diagram-js.css"></head>
<body><script src="/bpmn-viewer.js"></script><script>
window.renderAll = async (names) => {
  const results = [];
  for (const name of names) {
    const r = { name, warnings: [], drawn: 0, empty: [], error: '' };
    const container = document.createElement('div');
    container.style.width = '1600px';
    container.style.height = '1000px';
    document.body.appendChild(container);
    const viewer = new BpmnJS({ container });
    try {
      const xml = await (await fetch('/files/' + name)).text();
      const { warnings } = await viewer.importXML(xml);
      r.warnings = warnings.map((w) => String(w.message || w));
      viewer.get('canvas').zoom('fit-viewport');
      const registry = viewer.get('elementRegistry');
      const root = viewer.get('canvas').getRootElement();
      for (const el of registry.getAll()) {
        if (el === root || el.type === 'label') continue;
        const box = registry.getGraphics(el).getBBox();
        if (box.width > 0 || box.height > 0) r.drawn++; else r.empty.push(el.id);
      }
    } catch (e) {
      r.error = String(e && e.message ? e.message : e);
    }
    viewer.destroy();
    container.remove();
    results.push(r);
  }
  return results;
};
</script></body></html>`

// TestBPMNRenders renders every committed .bpmn file with bpmn-js (the
// viewer of bpmn.io and Camunda Modeler) in headless Chromium: it imports
// without a warning and draws every shape and edge of the diagram.
func TestBPMNRenders(t *testing.T) {
	t.Parallel()
	files := committedBPMN(t)
	_, dir := bpmnTools(t)
	chromium := findChromiumPath()
	needTool(t, chromium != "", "chromium")

	want := map[string]int{}
	mux := http.NewServeMux()
	for _, f := range files {
		content, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		m := readBPMN(t, f, content)
		want[f] = len(m.shapes) + len(m.edges)
		mux.HandleFunc("/files/"+f, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/xml")
			_, _ = w.Write(content)
		})
	}
	dist := filepath.Join(dir, "node_modules", "bpmn-js", "dist")
	mux.HandleFunc("/bpmn-viewer.js", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, filepath.Join(dist, "bpmn-viewer.production.min.js"))
	})
	mux.HandleFunc("/diagram-js.css", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, filepath.Join(dist, "assets", "diagram-js.css"))
	})
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(renderPage))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	profile, err := os.MkdirTemp("", "saga-bpmn-chromium-")
	require.NoError(t, err)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.UserDataDir(profile), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true))
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		for range 50 { // helper processes may write into the profile for a moment
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	names, err := json.Marshal(files)
	require.NoError(t, err)
	var results []struct {
		Name     string
		Warnings []string
		Drawn    int
		Empty    []string
		Error    string
	}
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitReady("body", chromedp.ByQuery),
		chromedp.Evaluate("renderAll("+string(names)+")", &results, func(p *runtime.EvaluateParams) *runtime.EvaluateParams {
			return p.WithAwaitPromise(true)
		})))
	require.Len(t, results, len(files))
	for _, r := range results {
		require.Empty(t, r.Error, r.Name)
		require.Empty(t, r.Warnings, r.Name)
		require.Empty(t, r.Empty, "%s: elements drawn without extent", r.Name)
		require.Equal(t, want[r.Name], r.Drawn, "%s: every shape and edge of the diagram is drawn", r.Name)
	}
}

// findChromiumPath returns $CHROMIUM, or the first Chromium or Chrome on
// PATH, or "".
func findChromiumPath() string {
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
