package saga

import (
	"encoding/json"
	"io"
	"net/http"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/protosaga/saga/runtime/envelope"
	"github.com/protosaga/saga/runtime/failure"
	"github.com/protosaga/saga/runtime/message"
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

// StartHandler returns an http.Handler that starts a saga from a POSTed
// protojson start message (a new one from newStart) and answers 202 Accepted
// with the saga id, a Location header and statusURL(sagaID), without waiting
// for any step. Starting is idempotent on the business key: a repeated request
// answers with the same saga id and created=false. The request's W3C trace
// context continues in the saga's messages. Generated code wraps it as
// <Saga>.HTTPHandler.
func (e *Engine) StartHandler(newStart func() message.Message, statusURL func(sagaID string) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxStartBody))
		if err != nil {
			http.Error(w, "read request: "+err.Error(), http.StatusBadRequest)
			return
		}
		start := newStart()
		if err := protojson.Unmarshal(body, start); err != nil {
			http.Error(w, "decode "+string(start.ProtoReflect().Descriptor().Name())+": "+err.Error(), http.StatusBadRequest)
			return
		}
		meta := envelope.Meta{Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate")}
		id, created, err := e.Start(r.Context(), start, meta)
		if err != nil {
			code := http.StatusInternalServerError
			if failure.ClassOf(err) == failure.ClassPermanent {
				code = http.StatusUnprocessableEntity
			}
			http.Error(w, "start saga: "+err.Error(), code)
			return
		}
		url := statusURL(id)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", url)
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(StartResponse{
			SagaID: id, CorrelationID: start.CorrelationKey(), Status: "ACCEPTED", StatusURL: url, Created: created,
		})
	})
}
