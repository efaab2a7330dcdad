package chaos_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/chaos"
	"github.com/protosaga/saga/internal/testenv"
)

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
	buildOut  []byte
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// soakBinary builds examples/placeorder/cmd/soak once per test process.
func soakBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "saga-soak-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		// go test puts its own GOROOT/bin first on PATH.
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("find the go command to build the soak binary: %w", err)
			return
		}
		binPath = filepath.Join(dir, "soak")
		cmd := exec.Command(goBin, "build", "-o", binPath, "github.com/protosaga/saga/examples/placeorder/cmd/soak")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	require.NoError(t, buildErr, "go build soak: %s", buildOut)
	return binPath
}

// TestSoakShort is the short chaos soak that runs in `make test`: 200 Place
// Order sagas and 100 Book Trip sagas (the travel example), 10 per second,
// on two relays, two orchestrators and two participant processes, with
// random participant faults, a SIGKILL at every named crash point, random SIGKILLs, one RabbitMQ restart and one PostgreSQL restart,
// then every invariant of the package documentation checked. It runs on
// servers of its own (testenv.PrivateServices): restarting the shared ones
// would break the tests of every other package running in parallel.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	bin := soakBinary(t)
	svc := testenv.PrivateServices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, chaos.Config{
		Bin:              bin,
		Services:         svc,
		Log:              testWriter{t},
		Seed:             uint64(time.Now().UnixNano()),
		Sagas:            200,
		Trips:            100,
		Rate:             10,
		Relays:           2,
		Orchestrators:    2,
		Participants:     2,
		CrashPoints:      true,
		KillEvery:        7 * time.Second,
		BrokerRestarts:   1,
		PostgresRestarts: 1,
		Transient:        0.08,
		Slow:             0.03,
		Duplicate:        0.05,
		DeclinedShare:    0.1,
		SoldOutShare:     0.08,
		RejectedShare:    0.05,
		NoPermitShare:    0.05,
		SettleTimeout:    2 * time.Minute,
	})
	require.NoError(t, err)
	t.Logf("report:\n%s", rep)
	require.Empty(t, rep.Violations)
	require.Equal(t, 300, rep.Sagas)
	require.Zero(t, rep.Lost)
	require.Zero(t, rep.DoubleEffects)
	for typ, n := range map[string]int{"PlaceOrder": 200, "BookTrip": 100} {
		f := rep.Types[typ]
		require.NotNil(t, f, "no figures for %s", typ)
		require.Equal(t, n, f.Sagas, typ)
		require.Zero(t, f.Lost, typ)
		require.Zero(t, f.DoubleEffects, typ)
		require.Positive(t, f.States["COMPLETED"], "no %s saga completed", typ)
		require.Positive(t, f.States["FAILED"], "no %s saga failed", typ)
	}
	// Book Trip's pivot started a Payment saga as its child for each trip
	// that reached it.
	require.NotNil(t, rep.Types["Payment"], "no Payment saga was started")
	require.Positive(t, rep.Types["Payment"].States["COMPLETED"], "no child Payment completed")
	for _, p := range chaos.CrashPoints() {
		require.Positive(t, rep.Kills["crash:"+string(p)], "no node was killed at %s", p)
	}
	require.Equal(t, 1, rep.ServerRestarts["broker"], "the broker restart did not happen")
	require.Equal(t, 1, rep.ServerRestarts["postgres"], "the PostgreSQL restart did not happen")
	for _, f := range []string{chaos.FaultTransient, chaos.FaultSlow, chaos.FaultSlowSent, chaos.FaultDuplicate} {
		require.Positive(t, rep.Faults[f], "no %s fault was injected", f)
	}
	require.Positive(t, rep.Duplicates, "no duplicate reached the saga")
	require.Positive(t, rep.Redelivered, "no outbox row was published twice")
	require.Positive(t, rep.HandedOff, "no consumer handed its rows to its node's relay")
	require.Positive(t, rep.States["COMPLETED"], "no saga completed")
	require.Positive(t, rep.States["FAILED"], "no saga failed (declined cards and sold-out products must)")
	po := rep.Types["PlaceOrder"] // only Place Order registers callbacks
	require.GreaterOrEqual(t, rep.Callbacks, po.States["COMPLETED"]+po.States["FAILED"]+po.States["MANUAL_REVIEW"],
		"every outcome called back (a saga may report FAILED, then MANUAL_REVIEW)")
	require.Greater(t, rep.CallbackRequests, rep.Callbacks, "the receiver's 503s made the dispatchers retry")
}

// testWriter sends progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-min(len(p), 1)]))
	return len(p), nil
}
