package saga

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/sagadef"
)

// maxStartBody bounds the request body StartHandler reads.
const maxStartBody = 1 << 20

// StartResponse is the JSON body of StartHandler's 202 Accepted answer.
type StartResponse struct {
	SagaID        string `json:"sagaId"`
	CorrelationID string `json:"correlationId"`
	Status        string `json:"status"`
	StatusURL     string `json:"statusUrl"`
	Created       bool   `json:"created"`
}

// ErrorResponse is the JSON body of the start and status handlers' error
// answers. Error says what went wrong in terms of the request; it never
// carries the text of an internal error (a driver's, the database's, a
// hook's). For such a failure, Reference names the log line that records
// the hidden error, so an operator can find it.
type ErrorResponse struct {
	Error     string `json:"error"`
	Reference string `json:"reference,omitempty"`
}

// StartHandler returns an http.Handler that starts a saga from a POSTed
// protojson start message (a new one from newStart) and answers 202 Accepted
// with the saga id, a Location header and statusURL(sagaID) (neither when
// statusURL is nil), without waiting for any step. Starting is idempotent on the business key: a repeated request
// answers with the same saga id and created=false. The request's W3C trace
// context continues in the saga's messages. Generated code wraps it as
// <Saga>.HTTPHandler.
//
// Errors are JSON ([ErrorResponse]): 405 for a method other than POST, 413
// for a body over 1 MiB, 400 for a body that is not the start message's
// JSON (the decoder's complaint about the client's JSON is described), 422
// when the engine refuses the start message (a permanent failure, such as
// the decider's Start refusing it), 503 when a transient failure (a
// serialization failure, the database restarting) may pass on a retry, 500
// otherwise. The last three never show the error: they answer with a
// reference that the error log line carries too.
func (e *Engine) StartHandler(newStart func() message.Message, statusURL func(sagaID string) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, ErrorResponse{Error: "method " + r.Method + " not allowed; start a saga with POST"})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxStartBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeError(w, http.StatusRequestEntityTooLarge, ErrorResponse{Error: "the request body is larger than 1 MiB"})
				return
			}
			e.cfg.Logger.DebugContext(r.Context(), "saga start: reading the request failed",
				"saga_type", e.def.Name, "error", err)
			writeError(w, http.StatusBadRequest, ErrorResponse{Error: "the request body could not be read"})
			return
		}
		start := newStart()
		if err := protojson.Unmarshal(body, start); err != nil {
			writeError(w, http.StatusBadRequest, ErrorResponse{
				Error: "decode " + string(start.ProtoReflect().Descriptor().Name()) + ": " + err.Error()})
			return
		}
		meta := message.Meta{Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate")}
		id, created, err := e.Start(r.Context(), start, meta)
		if err != nil {
			code, msg := http.StatusInternalServerError, "the saga could not be started"
			switch retry.ClassOf(err) {
			case retry.ClassPermanent:
				code, msg = http.StatusUnprocessableEntity, "the saga refused this start message"
			case retry.ClassTransient:
				code, msg = http.StatusServiceUnavailable, "the saga could not be started now; try again"
				w.Header().Set("Retry-After", "1")
			}
			e.hiddenError(r.Context(), w, code, msg, "saga start failed", err,
				"business_key", start.CorrelationKey())
			return
		}
		var url string
		if statusURL != nil {
			url = statusURL(id)
			w.Header().Set("Location", url)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(StartResponse{
			SagaID: id, CorrelationID: start.CorrelationKey(), Status: "ACCEPTED", StatusURL: url, Created: created,
		})
	})
}

// Phase is a coarse summary of where an instance is, for clients that do
// not know the saga's states.
type Phase string

// Phases.
const (
	// PhaseRunning: the saga waits on a step or a compensation.
	PhaseRunning Phase = "running"
	// PhaseCompleted, PhaseFailed, PhaseCancelled: it ended in
	// COMPLETED, FAILED or CANCELLED.
	PhaseCompleted Phase = "completed"
	PhaseFailed    Phase = "failed"
	PhaseCancelled Phase = "cancelled"
	// PhaseManualReview: it waits for an operator.
	PhaseManualReview Phase = "manual_review"
)

// Phase summarizes the instance's state. A state this release of the
// definition does not know (a newer release's step) counts as running.
func (s Status) Phase() Phase {
	switch {
	case s.StateKind == sagadef.StateKindManualReview:
		return PhaseManualReview
	case s.State == sagadef.StateCompleted:
		return PhaseCompleted
	case s.State == sagadef.StateFailed:
		return PhaseFailed
	case s.State == sagadef.StateCancelled:
		return PhaseCancelled
	}
	return PhaseRunning
}

// StatusResponse is the JSON body of StatusHandler's answer.
type StatusResponse struct {
	SagaID      string    `json:"sagaId"`
	SagaType    string    `json:"sagaType"`
	BusinessKey string    `json:"businessKey"`
	State       string    `json:"state"`
	Status      Phase     `json:"status"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

// StatusHandler returns an http.Handler that answers GET (and HEAD) with
// the status of the instance whose saga id is the request's path value
// "id", as JSON ([StatusResponse]): ids, state, a coarse [Phase] and when it
// last changed. It shows no saga data and no error text (last error and
// review reason may name internals). Mount it with a Go 1.22 pattern naming
// {id}, e.g. "GET /sagas/place_order/{id}" (the generated <Saga>.StatusPattern):
// the start handler's statusUrl then points at it.
//
// Errors are JSON ([ErrorResponse]): 404 for an id that names no instance
// of this saga type (or is not a saga id), 405 for other methods, 500 with
// a logged reference when the database fails.
func (e *Engine) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, ErrorResponse{Error: "method " + r.Method + " not allowed; read a saga's status with GET"})
			return
		}
		id := r.PathValue("id")
		st, err := e.Status(r.Context(), id)
		switch {
		case errors.Is(err, ErrNotFound):
			writeError(w, http.StatusNotFound, ErrorResponse{Error: "no " + e.def.Name + " saga with this id"})
			return
		case err != nil:
			e.hiddenError(r.Context(), w, http.StatusInternalServerError, "the saga's status could not be read",
				"saga status failed", err, "saga_id", id)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		_ = json.NewEncoder(w).Encode(StatusResponse{
			SagaID: st.ID, SagaType: st.Type, BusinessKey: st.BusinessKey, State: st.State,
			Status: st.Phase(), UpdatedAt: st.UpdatedAt,
		})
	})
}

// hiddenError answers a failure whose cause the client must not see: msg
// and a new reference, which the log line recording err carries too.
func (e *Engine) hiddenError(ctx context.Context, w http.ResponseWriter, code int, msg, logMsg string, err error, attrs ...any) {
	ref := errorReference()
	level := slog.LevelError
	if code < http.StatusInternalServerError {
		level = slog.LevelWarn
	}
	args := append([]any{"saga_type", e.def.Name, "error_reference", ref, "status", code, "error", err}, attrs...)
	e.cfg.Logger.Log(ctx, level, logMsg, args...)
	writeError(w, code, ErrorResponse{Error: msg, Reference: ref})
}

// errorReference returns a new reference for a hidden error: 16 random
// hex digits.
func errorReference() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func writeError(w http.ResponseWriter, code int, body ErrorResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
