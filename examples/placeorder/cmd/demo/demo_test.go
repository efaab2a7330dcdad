package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/browsertest"
	"github.com/protosaga/saga/internal/testenv"
)

// lockedBuffer is the demo's output, written by its goroutine and read by
// the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// walkthrough is what the demo printed for the operator to follow.
type walkthrough struct {
	sagaID, order, console, base, repairToken string
	show, parkedList, retry, dismiss          string // sagactl command lines
	dismissPoison, log                        string
	sql                                       string // the fix, from the psql line
	startURL, startBody                       string
}

var (
	reRepair  = regexp.MustCompile(`(?m)^Repair the parked order (\S+) \(saga (\S+)\)$`)
	reConsole = regexp.MustCompile(`(?m)^  console  (\S+)/  sign in with the repair token (\S+) `)
	reExport  = regexp.MustCompile(`(?m)^  sagactl  in a shell at the repository's root: (export SAGACTL_SERVER=\S+ SAGACTL_TOKEN=\S+)$`)
	reSagactl = regexp.MustCompile(`(?m)go run \./cmd/sagactl [^\n]*?(?:\s{2,}\(|$)`)
	rePsql    = regexp.MustCompile(`(?m)psql "[^"]+" -c "([^"]+)"$`)
	reStart   = regexp.MustCompile(`curl -s -X POST (\S+) -H 'Content-Type: application/json' \\\n\s+-d '([^']+)'`)
	reMetrics = regexp.MustCompile(`curl -s (\S+)/metrics`)
)

// parseWalkthrough takes the commands out of the demo's printed repair.
func parseWalkthrough(t *testing.T, out string) walkthrough {
	t.Helper()
	var w walkthrough
	m := reRepair.FindStringSubmatch(out)
	require.NotNil(t, m, "no repair walkthrough in:\n%s", out)
	w.order, w.sagaID = m[1], m[2]
	m = reConsole.FindStringSubmatch(out)
	require.NotNil(t, m, "no console line in:\n%s", out)
	w.console, w.repairToken = m[1], m[2]
	m = reExport.FindStringSubmatch(out)
	require.NotNil(t, m, "no sagactl environment in:\n%s", out)
	export := m[1]
	var cmds []string
	for _, c := range reSagactl.FindAllString(out, -1) {
		// In the shell where the operator exported the variables.
		cmds = append(cmds, export+"; "+strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(c), "(")))
	}
	find := func(part string) string {
		t.Helper()
		for _, c := range cmds {
			if strings.Contains(c, part) {
				return c
			}
		}
		t.Fatalf("no sagactl command with %q among %q", part, cmds)
		return ""
	}
	w.show = find("sagas show " + w.sagaID)
	w.parkedList = find("parked list --saga " + w.sagaID)
	w.retry = find("sagas retry " + w.sagaID)
	w.dismiss = find("parked dismiss --saga " + w.sagaID)
	w.dismissPoison = find(`--reason "undecodable`)
	w.log = find("cmd/sagactl log")
	m = rePsql.FindStringSubmatch(out)
	require.NotNil(t, m, "no psql line in:\n%s", out)
	w.sql = m[1]
	m = reStart.FindStringSubmatch(out)
	require.NotNil(t, m, "no start command in:\n%s", out)
	w.startURL, w.startBody = m[1], m[2]
	m = reMetrics.FindStringSubmatch(out)
	require.NotNil(t, m)
	w.base = m[1]
	return w
}

// sagactl runs one printed sagactl line, as an operator would paste it,
// from the module's root, and returns its output.
func sagactl(t *testing.T, line string) string {
	t.Helper()
	out, err := runLine(line)
	require.NoError(t, err, "%s\n%s", line, out)
	return out
}

func runLine(line string) (string, error) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pause waits longer than the shipping step's timeout: every step of the
// walkthrough meets the saga after its step has acted again.
func pause(d time.Duration) { time.Sleep(d + d/2) }

// TestWalkthroughFollowedSlowly runs the demo as `make demo` does (serving
// after the summary) and follows its printed repair walkthrough, pausing
// between steps longer than the shipping step's timeout (shortened from the
// contract's 1m0s so that the test meets every state the walkthrough must
// hold in: the step resent, every attempt spent, the saga in manual
// review). Then: the saga completes, the parked copies close, every parked
// gauge is back at 0, the log names the repairs, the runtime's logs are
// JSON and name the trace of every message they are about, and an order
// started from outside runs on the real clock.
func TestWalkthroughFollowedSlowly(t *testing.T) {
	t.Parallel()
	const stepTimeout = 3 * time.Second
	pgURL, amqpURL := testenv.PostgresURL(t), testenv.AMQP(t)
	logPath := filepath.Join(t.TempDir(), "demo.log")
	getenv := func(k string) string {
		switch k {
		case "SAGA_PG_URL":
			return pgURL
		case "SAGA_AMQP_URL":
			return amqpURL
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedBuffer{}
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		done <- run(ctx, []string{"-n", "20", "-addr", "127.0.0.1:0", "-log", logPath,
			"-step-timeout", "ScheduleShipping=" + stepTimeout.String()}, out, out, getenv)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "the demo ends cleanly when interrupted:\n%s", out)
		case <-time.After(2 * time.Minute):
			t.Errorf("the demo did not stop within 2 minutes of its interrupt")
		}
	})
	deadline := time.Now().Add(4 * time.Minute)
	for !strings.Contains(out.String(), "Serving the console until Ctrl-C") {
		select {
		case err := <-done:
			t.Fatalf("the demo ended before serving: %v\n%s", err, out)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the demo never served:\n%s", out)
		time.Sleep(100 * time.Millisecond)
	}
	w := parseWalkthrough(t, out.String())
	require.Regexp(t, `carrier manifests\s+[1-9][0-9]*\s+\(bookings on [1-9][0-9]* carriers' manifests`, out.String(),
		"shipping put the bookings on the carriers' manifests under fenced leases")
	// The travel fleet ran next to the orders, each scenario as scripted
	// (the demo fails otherwise): one line per scenario, with one trip's
	// effects in order (the three holds of the parallel group in the order
	// they were made; their cancellations in reverse contract order).
	require.Regexp(t, `card declined\s+FAILED: 4\s+travellers:valid travellers:permit_granted (\w+:reserved ){3}insurance:bought `+
		`cards:declined insurance:cancelled cars:cancelled hotels:cancelled flights:cancelled\n`, out.String())
	require.Regexp(t, `payment flagged\s+FAILED: 4\s+travellers:valid travellers:permit_granted (\w+:reserved ){3}`+
		`cards:authorized fraud:flagged cards:voided cars:cancelled hotels:cancelled flights:cancelled\n`, out.String())
	require.Contains(t, out.String(), "starts, run by the payments service): COMPLETED: 8, FAILED: 8\n")
	require.Regexp(t, `flight sold out\s+FAILED: 4\s+travellers:valid travellers:permit_granted .*flights:unavailable`, out.String())
	require.Regexp(t, `entry permit denied\s+FAILED: 4\s+travellers:valid travellers:permit_denied\n`, out.String())
	require.Regexp(t, `entry permit decisions recorded early: \d+ `, out.String())
	require.Contains(t, out.String(), "insurance skipped by the decider: 8 ")
	require.Contains(t, out.String(), "itineraries sent: 8 ")
	pool, err := pgxpool.New(context.Background(), pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	state := func() string {
		t.Helper()
		var s string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT state FROM saga_place_order WHERE id = $1`, w.sagaID).Scan(&s))
		return s
	}

	// The clock is real: nothing the demo wrote is stamped in the future.
	var future int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
  (SELECT count(*) FROM saga_place_order WHERE created_at > now() OR updated_at > now()) +
  (SELECT count(*) FROM saga_audit WHERE at > now())`).Scan(&future))
	require.Zero(t, future, "rows stamped in the future: the saga clock was moved")

	// Long after the walkthrough was printed: the step resent its command
	// until it spent its attempts, and the saga waits in manual review.
	require.Eventually(t, func() bool { return state() == "MANUAL_REVIEW" }, 2*time.Minute, stepTimeout,
		"the step never spent its attempts")
	pause(stepTimeout)

	// 1. See it: the saga, its parked copies (none current any more), in
	// sagactl and in the console.
	shown := sagactl(t, w.show)
	require.Contains(t, shown, "state     MANUAL_REVIEW")
	require.Contains(t, shown, "repairs   retry;")
	copies := sagactl(t, w.parkedList)
	require.Contains(t, copies, "ScheduleShipping")
	require.Regexp(t, `5 parked message\(s\)`, copies, "one parked copy per attempt")
	require.NotContains(t, copies, "CURRENT")
	bctx := browsertest.New(t)
	var summary string
	require.NoError(t, chromedp.Run(bctx,
		chromedp.Navigate(w.console+"/"),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", w.repairToken, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("#who-name", chromedp.ByQuery),
		chromedp.Evaluate(`location.hash = "#/saga/`+w.sagaID+`"`, new(string)),
		chromedp.WaitVisible("#act-retry", chromedp.ByQuery),
		chromedp.Text("#position-summary", &summary, chromedp.ByQuery),
	))
	require.Contains(t, summary, "in manual review")
	pause(stepTimeout)

	// 2. Fix the cause.
	_, err = pool.Exec(context.Background(), w.sql)
	require.NoError(t, err, w.sql)
	pause(stepTimeout)

	// 3. Resend it.
	retried := sagactl(t, w.retry)
	require.Contains(t, retried, "retry applied: saga "+w.sagaID+" is SCHEDULE_SHIPPING")
	pause(stepTimeout)

	// 4. See it done.
	require.Eventually(t, func() bool {
		shown, err := runLine(w.show)
		return err == nil && strings.Contains(shown, "state     COMPLETED")
	}, time.Minute, time.Second)
	pause(stepTimeout)

	// 5. Close the copies that no longer apply: the console's button, then
	// the printed command, which finds nothing left.
	route := func(hash string) chromedp.Action {
		return chromedp.Tasks{
			chromedp.Evaluate(`location.hash = "`+hash+`"`, new(string)),
			chromedp.Poll(`document.body.dataset.route === "`+hash+`"`, nil, chromedp.WithPollingTimeout(time.Minute)),
		}
	}
	require.NoError(t, chromedp.Run(bctx,
		route("#/parked"),
		route("#/saga/"+w.sagaID),
		chromedp.WaitVisible("#dismiss-superseded", chromedp.ByQuery),
		chromedp.Click("#dismiss-superseded", chromedp.ByQuery),
		chromedp.WaitVisible("#confirm-reason", chromedp.ByQuery),
		chromedp.SendKeys("#confirm-reason", "resent by retry", chromedp.ByQuery),
		chromedp.Click("#confirm-ok", chromedp.ByQuery),
		chromedp.Poll(`!document.querySelector("#saga-parked") && document.body.dataset.route.includes("#/saga/")`, nil,
			chromedp.WithPollingTimeout(time.Minute)),
	))
	require.Contains(t, sagactl(t, w.dismiss), "dismiss done: nothing matched")
	pause(stepTimeout)

	// 6. The poison message.
	require.Contains(t, sagactl(t, w.dismissPoison), ": dismissed")

	// Every parked gauge is back at 0.
	resp, err := http.Get(w.base + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	var gauges int
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "saga_parked_messages{") {
			gauges++
			require.True(t, strings.HasSuffix(line, " 0"), "a parked gauge not at 0: %s", line)
		}
	}
	require.Equal(t, 2, gauges, "the inventory's and the shipping queue's")
	require.Contains(t, string(metrics), `service_name="placeorder-demo"`)
	require.Contains(t, string(metrics), "go_goroutines ")

	// Who did what, and why.
	log := sagactl(t, w.log)
	require.Regexp(t, `(?m)^\S+\s+operator\s+retry\s+`+w.sagaID+`\s+`+w.order+`\s+MANUAL_REVIEW -> SCHEDULE_SHIPPING\s+.*carrier for IS added`, log)
	require.Regexp(t, `(?m)^\S+\s+operator\s+dismiss\s+`+w.sagaID+`\s+`+w.order+`\s+COMPLETED\s+.*resent by retry`, log)

	// An order started from outside runs on the real clock: created now,
	// its first step's timeout the contract's 30 s later.
	before := time.Now()
	resp, err = http.Post(w.startURL, "application/json", strings.NewReader(w.startBody))
	require.NoError(t, err)
	var started struct {
		SagaID string `json:"sagaId"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var created, firstAudit time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT created_at FROM saga_place_order WHERE id = $1`, started.SagaID).Scan(&created))
	require.WithinRange(t, created, before.Add(-time.Second), time.Now().Add(time.Second), "created on the real clock")
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT min(at) FROM saga_audit WHERE saga_id = $1`, started.SagaID).Scan(&firstAudit))
	require.WithinRange(t, firstAudit, before.Add(-time.Second), time.Now().Add(time.Second))
	require.Eventually(t, func() bool {
		var s string
		_ = pool.QueryRow(context.Background(), `SELECT state FROM saga_place_order WHERE id = $1`, started.SagaID).Scan(&s)
		return s == "COMPLETED"
	}, time.Minute, 100*time.Millisecond)

	// The runtime's logs: JSON, with trace ids, the repair at Info.
	f, err := os.Open(logPath)
	require.NoError(t, err)
	defer f.Close()
	var repairs, aboutSaga int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "a log line that is not JSON: %s", sc.Text())
		if rec["saga_id"] == w.sagaID && rec["message_id"] != nil {
			aboutSaga++
			require.NotEmpty(t, rec["trace_id"], "a log line about one of the saga's messages without its trace id: %s", sc.Text())
		}
		if rec["msg"] == "admin repair" {
			repairs++
			require.Equal(t, "INFO", rec["level"])
			require.Equal(t, "operator", rec["operator"])
			require.Equal(t, "carrier for IS added", rec["reason"])
		}
	}
	require.NoError(t, sc.Err())
	require.Positive(t, aboutSaga)
	require.Equal(t, 1, repairs)
	t.Logf("walkthrough followed in %s", time.Since(began).Round(time.Second))
}
