package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/callback/signature"
)

// receiver is the soak's callback client: every order registers a URL on
// it. It verifies each delivery's signature, deduplicates by callback id,
// and answers 503 to every fifth request, so deliveries are retried while
// dispatchers are killed and servers restarted.
type receiver struct {
	url      string
	server   *http.Server
	verifier signature.Verifier

	mu       sync.Mutex
	requests int
	byID     map[string]callback.Payload
	byOrder  map[string][]string // order id → states reported
	dupes    int                 // verified deliveries of an id already processed
	refused  int                 // deliveries whose signature or body was refused
}

// newCallbackKey returns a fresh signing key as a node's environment
// carries it (callback.EnvKeys) and as the receiver checks it.
func newCallbackKey() (env string, key signature.Key) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	key = signature.Key{ID: "soak", Secret: []byte(hex.EncodeToString(b[:]))}
	return key.ID + ":" + string(key.Secret), key
}

func startReceiver(key signature.Key) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("soak: listen for callbacks: %w", err)
	}
	r := &receiver{
		url:      "http://" + ln.Addr().String() + "/orders/",
		verifier: signature.Verifier{Keys: []signature.Key{key}},
		byID:     map[string]callback.Payload{},
		byOrder:  map[string][]string{},
	}
	r.server = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := r.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.mu.Lock()
			r.refused = -1 // reported by check
			r.mu.Unlock()
		}
	}()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	order, _ := strings.CutPrefix(req.URL.Path, "/orders/")
	id, body, err := r.verifier.VerifyRequest(req, 1<<20)
	var p callback.Payload
	if err == nil {
		err = json.Unmarshal(body, &p)
	}
	if err == nil && (p.CallbackID != id || p.BusinessKey != order) {
		err = errors.New("payload does not match its id or URL")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	switch {
	case err != nil:
		r.refused++
		http.Error(w, "refused", http.StatusUnauthorized)
	case r.requests%5 == 0:
		http.Error(w, "busy", http.StatusServiceUnavailable)
	default:
		if _, seen := r.byID[id]; seen {
			r.dupes++
		} else {
			r.byID[id] = p
			r.byOrder[order] = append(r.byOrder[order], p.State)
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// checkCallbacks verifies that every saga that reached an outcome the
// contract calls back was told so, its final outcome last, each callback
// processed once by id; that no callback was parked or left pending; and
// that every delivery verified.
func (r *run) checkCallbacks(ctx context.Context, rep *Report, sagas map[string]sagaRow) error {
	var rows, parked, pending int
	if err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE parked_at IS NOT NULL),
  count(*) FILTER (WHERE delivered_at IS NULL AND parked_at IS NULL) FROM saga_callback`).Scan(&rows, &parked, &pending); err != nil {
		return fmt.Errorf("check: callbacks: %w", err)
	}
	reasons, err := r.pool.Query(ctx, `SELECT saga_id, park_reason FROM saga_callback WHERE parked_at IS NOT NULL LIMIT 5`)
	if err != nil {
		return fmt.Errorf("check: parked callbacks: %w", err)
	}
	var sagaID, reason string
	if _, err := pgx.ForEachRow(reasons, []any{&sagaID, &reason}, func() error {
		rep.violate("callback of saga %s parked: %s", sagaID, reason)
		return nil
	}); err != nil {
		return fmt.Errorf("check: parked callbacks: %w", err)
	}
	if pending > 0 {
		rep.violate("%d callbacks still pending after the run settled", pending)
	}
	r.receiver.mu.Lock()
	defer r.receiver.mu.Unlock()
	rep.Callbacks, rep.CallbackDuplicates, rep.CallbackRequests = len(r.receiver.byID), r.receiver.dupes, r.receiver.requests
	if r.receiver.refused != 0 {
		rep.violate("callback receiver refused %d deliveries (signature or payload)", r.receiver.refused)
	}
	if rows != len(r.receiver.byID) {
		rep.violate("%d callbacks written, %d distinct ones received", rows, len(r.receiver.byID))
	}
	for key, sg := range sagas {
		switch sg.state {
		case "COMPLETED", "FAILED", "MANUAL_REVIEW":
			// The last outcome told is the one the saga ended in; an
			// earlier one may precede it (FAILED, then MANUAL_REVIEW for
			// a success that arrived after the compensation).
			got := r.receiver.byOrder[key]
			if len(got) == 0 || got[len(got)-1] != sg.state {
				rep.violate("saga %s (%s) ended %s; its client was told %v", sg.id, key, sg.state, got)
				rep.lost(sagaPlaceOrder, 1)
			}
		}
	}
	return nil
}
