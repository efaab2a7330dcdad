package admin

import (
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/protosaga/saga/runtime/callback"
)

// Callback is one HTTP callback delivery as the API shows it (package
// callback; docs/callbacks.md).
type Callback struct {
	ID            string          `json:"id"`
	SagaID        string          `json:"saga_id"`
	SagaType      string          `json:"saga_type"`
	Event         string          `json:"event"`
	URL           string          `json:"url,omitempty"`
	Client        string          `json:"client,omitempty"`
	Status        callback.Status `json:"status"`
	Attempts      int             `json:"attempts"`
	LastStatus    int             `json:"last_status,omitempty"`
	LastError     string          `json:"last_error,omitempty"`
	ParkReason    string          `json:"park_reason,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	NextAttemptAt *time.Time      `json:"next_attempt_at,omitempty"`
	DeliveredAt   *time.Time      `json:"delivered_at,omitempty"`
	ParkedAt      *time.Time      `json:"parked_at,omitempty"`
}

// CallbackList answers GET /api/callbacks.
type CallbackList struct {
	Callbacks []Callback `json:"callbacks"`
}

// CallbackReplayRequest is the body of POST /api/callbacks/{id}/replay.
type CallbackReplayRequest struct {
	Reason string `json:"reason"`
}

// CallbackReplayResult answers it: the delivery, due again.
type CallbackReplayResult struct {
	Callback Callback `json:"callback"`
	Operator string   `json:"operator"`
	Reason   string   `json:"reason"`
}

func toCallback(r callback.Record) Callback {
	c := Callback{ID: r.ID, SagaID: r.SagaID, SagaType: r.SagaType, Event: r.Event, URL: r.URL, Client: r.Client,
		Status: r.Status, Attempts: r.Attempts, LastStatus: r.LastStatus, LastError: r.LastError, ParkReason: r.ParkReason,
		CreatedAt: r.CreatedAt, DeliveredAt: r.DeliveredAt, ParkedAt: r.ParkedAt}
	if r.Status == callback.StatusPending {
		next := r.NextAttemptAt
		c.NextAttemptAt = &next
	}
	return c
}

// handleListCallbacks answers GET /api/callbacks?saga=ID&status=S&limit=N:
// deliveries newest first.
func (s *Server) handleListCallbacks(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "saga", "status", "limit")
	if err != nil {
		return err
	}
	limit, err := q.limit()
	if err != nil {
		return err
	}
	f := callback.Filter{SagaID: q.str("saga"), Status: callback.Status(q.str("status")), Limit: limit}
	if f.SagaID != "" {
		if _, err := uuid.Parse(f.SagaID); err != nil {
			return badRequest("saga=%q: want a saga id (a UUID)", f.SagaID)
		}
	}
	switch f.Status {
	case "", callback.StatusPending, callback.StatusDelivered, callback.StatusParked:
	default:
		return badRequest("status=%q: want pending, delivered or parked", f.Status)
	}
	recs, err := callback.List(r.Context(), s.cfg.Pool, f)
	if err != nil {
		return err
	}
	out := CallbackList{Callbacks: []Callback{}}
	for _, rec := range recs {
		out.Callbacks = append(out.Callbacks, toCallback(rec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handleReplayCallback answers POST /api/callbacks/{id}/replay: a parked
// delivery becomes due again (same id and body, fresh retry budget), and
// saga_callback_audit records who and why.
func (s *Server) handleReplayCallback(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := uuid.Parse(id); err != nil {
		return badRequest("callback id %q: want a UUID", id)
	}
	var req CallbackReplayRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	who := principalOf(r.Context()).Name
	ctx := r.Context()
	switch err := callback.Replay(ctx, s.cfg.Pool, id, who, reason); {
	case errors.Is(err, callback.ErrNotFound):
		return apiErr(http.StatusNotFound, "not_found", "callback %s not found", id)
	case errors.Is(err, callback.ErrNotParked):
		return apiErr(http.StatusConflict, "refused", "callback %s is not parked: only a parked delivery is replayed", id)
	case err != nil:
		return err
	}
	rec, err := callback.Get(ctx, s.cfg.Pool, id)
	if err != nil {
		return err
	}
	s.cfg.Logger.Info("callback replayed", "callback_id", id, "saga_id", rec.SagaID, "operator", who, "reason", reason)
	writeJSON(w, http.StatusOK, CallbackReplayResult{Callback: toCallback(rec), Operator: who, Reason: reason})
	return nil
}
