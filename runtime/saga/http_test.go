package saga_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// logBuffer collects an engine's log lines; handlers log from the
// server's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// internalText is what the failures the tests cause say about the system:
// none of it may reach a client.
var internalText = []string{"hunter2", "10.0.0.7", "dial tcp", "SQLSTATE", "40001", "rule 17", "saga_place_order",
	"relation", "does not exist", "test.order.v1", "pgx", "begin saga"}

// requireHidden checks an error answer: JSON with a message and a
// reference, no internal text, and the reference in the log line that
// records the hidden error.
func requireHidden(t *testing.T, resp *http.Response, logs *logBuffer, wantCode int, wantLogged string) saga.ErrorResponse {
	t.Helper()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, wantCode, resp.StatusCode, string(raw))
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	for _, s := range internalText {
		require.NotContains(t, string(raw), s, "the answer leaks internal text")
	}
	var body saga.ErrorResponse
	require.NoError(t, json.Unmarshal(raw, &body))
	require.NotEmpty(t, body.Error)
	require.Regexp(t, `^[0-9a-f]{16}$`, body.Reference)
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, body.Reference) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.NotNil(t, line, "no log line carries reference %s:\n%s", body.Reference, logs.String())
	require.Equal(t, body.Reference, line["error_reference"])
	require.Contains(t, line["error"], wantLogged, "the log records the hidden error")
	return body
}

func TestStartHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	logs := &logBuffer{}
	e := b.newEngine(t, func(c *saga.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	srv := httptest.NewServer(e.StartHandler(func() message.Message { return msgPlaceOrder.New() },
		func(id string) string { return "/sagas/place_order/" + id }))
	t.Cleanup(srv.Close)
	post := func(body string) *http.Response {
		t.Helper()
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	decode := func(resp *http.Response, v any) {
		t.Helper()
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}

	resp := post(`"o-http"`)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var started saga.StartResponse
	decode(resp, &started)
	require.Equal(t, "/sagas/place_order/"+started.SagaID, started.StatusURL)
	require.Equal(t, started.StatusURL, resp.Header.Get("Location"))
	require.True(t, started.Created)
	require.Equal(t, "o-http", started.CorrelationID)
	resp = post(`"o-http"`)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var again saga.StartResponse
	decode(resp, &again)
	require.Equal(t, started.SagaID, again.SagaID)
	require.False(t, again.Created)

	t.Run("without a status URL", func(t *testing.T) {
		bare := httptest.NewServer(e.StartHandler(func() message.Message { return msgPlaceOrder.New() }, nil))
		defer bare.Close()
		resp, err := http.Post(bare.URL, "application/json", strings.NewReader(`"o-bare"`))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		require.Empty(t, resp.Header.Get("Location"))
		var got saga.StartResponse
		decode(resp, &got)
		require.NotEmpty(t, got.SagaID)
		require.Empty(t, got.StatusURL)
	})
	t.Run("the client's own mistakes are described", func(t *testing.T) {
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		require.Equal(t, http.MethodPost, resp.Header.Get("Allow"))
		var body saga.ErrorResponse
		decode(resp, &body)
		require.Contains(t, body.Error, "POST")
		require.Empty(t, body.Reference)

		resp = post(`{"order": `)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		decode(resp, &body)
		require.Contains(t, body.Error, "decode StringValue: ")
		require.Contains(t, body.Error, "invalid value for string field value")
		require.Empty(t, body.Reference)

		resp = post(`"` + strings.Repeat("x", 1<<20) + `"`)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		decode(resp, &body)
		require.Equal(t, "the request body is larger than 1 MiB", body.Error)
	})
	t.Run("internal failures are hidden behind a reference", func(t *testing.T) {
		body := requireHidden(t, post(`"secret-1"`), logs, http.StatusInternalServerError, "password=hunter2")
		require.Equal(t, "the saga could not be started", body.Error)
		body = requireHidden(t, post(`"refused-1"`), logs, http.StatusUnprocessableEntity, "internal rule 17")
		require.Equal(t, "the saga refused this start message", body.Error)
		resp := post(`"transient-1"`)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		body = requireHidden(t, resp, logs, http.StatusServiceUnavailable, "SQLSTATE 40001")
		require.Equal(t, "the saga could not be started now; try again", body.Error)
		first := body.Reference
		body = requireHidden(t, post(`"secret-2"`), logs, http.StatusInternalServerError, "password=hunter2")
		require.NotEqual(t, first, body.Reference, "every failure has its own reference")
	})
	t.Run("a database error is hidden", func(t *testing.T) {
		// Last: it breaks the saga's table.
		_, err := b.pool.Exec(context.Background(), `ALTER TABLE saga_place_order RENAME TO saga_place_order_gone`)
		require.NoError(t, err)
		requireHidden(t, post(`"o-db"`), logs, http.StatusInternalServerError, `relation "saga_place_order" does not exist`)
	})
}

func TestStatusHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, defOptions{})
	logs := &logBuffer{}
	e := b.newEngine(t, func(c *saga.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	mux := http.NewServeMux()
	mux.Handle("GET /sagas/place_order/{id}", e.StatusHandler())
	mux.Handle("/any/{id}", e.StatusHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(method, path string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	status := func(id string) map[string]any {
		t.Helper()
		resp := get(http.MethodGet, "/sagas/place_order/"+id)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return body
	}

	running := b.start(t, "o-running")
	b.clock.Advance(time.Second)
	got := status(running)
	require.Equal(t, map[string]any{
		"sagaId": running, "sagaType": sagaTypeName, "businessKey": "o-running", "state": stReserve,
		"status": "running", "updatedAt": baseTime.Format(time.RFC3339),
	}, got, "ids, state, phase and time: no data, no error text")

	failed := b.start(t, "o-failed")
	b.mustReply(t, failed, msgInventoryFailed)
	require.Equal(t, "failed", status(failed)["status"])
	review := b.start(t, "o-review")
	b.mustReply(t, review, msgInventoryReserved)
	b.mustReply(t, review, msgPaymentAuthorized)
	_, err := b.reply(t, review, msg(msgShippingScheduled, "o-review"), "")
	require.ErrorIs(t, err, sagadef.ErrMisaddressed, "a reply without causation changes nothing")
	st := b.status(t, review)
	_, err = e.Cancel(context.Background(), review, st.Version, "ops", "test")
	require.NoError(t, err)
	require.Equal(t, "cancelled", status(review)["status"])

	head := get(http.MethodHead, "/sagas/place_order/"+running)
	require.Equal(t, http.StatusOK, head.StatusCode)
	raw, err := io.ReadAll(head.Body)
	require.NoError(t, err)
	require.Empty(t, raw)

	for _, id := range []string{newID(), "not-a-uuid", "%20"} {
		resp := get(http.MethodGet, "/sagas/place_order/"+id)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, id)
		var body saga.ErrorResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		require.Equal(t, "no "+sagaTypeName+" saga with this id", body.Error)
	}
	for _, m := range []string{http.MethodPost, http.MethodDelete} {
		resp := get(m, "/any/"+running)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
		require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	}

	_, err = b.pool.Exec(context.Background(), `ALTER TABLE saga_place_order RENAME TO saga_place_order_gone`)
	require.NoError(t, err)
	body := requireHidden(t, get(http.MethodGet, "/sagas/place_order/"+running), logs, http.StatusInternalServerError, "does not exist")
	require.Equal(t, "the saga's status could not be read", body.Error)
	require.False(t, slices.Contains(internalText, body.Error))
}
