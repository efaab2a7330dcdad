package depcheck

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deps lists the non-test dependencies of pkgs as `go list -deps` sees them.
func deps(t *testing.T, pkgs ...string) map[string]bool {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, string(out))
	m := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		m[p] = true
	}
	return m
}

func forbidden(t *testing.T, got map[string]bool, prefixes ...string) {
	t.Helper()
	for p := range got {
		for _, f := range prefixes {
			require.False(t, strings.HasPrefix(p, f), "%s is linked, but must not be", p)
		}
	}
}

func TestRuntimeLinksNoTooling(t *testing.T) {
	t.Parallel()
	got := deps(t, "github.com/protosaga/saga/runtime/...")
	require.True(t, got["github.com/jackc/pgx/v5"], "sanity: the runtime links pgx")
	forbidden(t, got,
		"github.com/protosaga/saga/internal/gen", "github.com/bufbuild/", "github.com/dave/jennifer",
		"golang.org/x/tools", "github.com/chromedp/", "github.com/stretchr/testify",
		"github.com/protosaga/saga/internal/testenv", "github.com/ThreeDotsLabs/",
		"github.com/pressly/goose", "github.com/golang-migrate/")
}

func TestInstrumentationLinksTheOTelAPIOnly(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"saga", "consumer", "outbox", "participant", "telemetry", "admin"} {
		got := deps(t, "github.com/protosaga/saga/runtime/"+pkg)
		forbidden(t, got, "go.opentelemetry.io/otel/sdk", "github.com/prometheus/")
	}
	exporter := deps(t, "github.com/protosaga/saga/runtime/telemetry/promexport")
	require.True(t, exporter["github.com/prometheus/client_golang/prometheus"], "sanity: the exporter links the client")
}
