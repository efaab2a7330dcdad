package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/callback/signature"
)

// receiver is the client side of the demo's HTTP callbacks: every order
// registers a URL here, and the receiver verifies each delivery's signature
// with the demo's key, deduplicates by callback id, and records the outcome
// per order, as a client of the shop would.
type receiver struct {
	url      string
	server   *http.Server
	verifier signature.Verifier

	mu       sync.Mutex
	byID     map[string]callback.Payload // processed callbacks
	byOrder  map[string][]string         // order id → states reported, in order
	dupes    int                         // deliveries of an id already processed
	rejected int                         // deliveries refused (signature, body)
}

// newCallbackKey makes the demo's signing key.
func newCallbackKey() signature.Key {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	return signature.Key{ID: "demo-" + time.Now().UTC().Format("20060102"), Secret: secret}
}

// startReceiver serves the receiver on a free loopback port.
func startReceiver(key signature.Key) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for callbacks: %w", err)
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
			fmt.Printf("demo: callback receiver stopped: %v\n", err)
		}
	}()
	return r, nil
}

// urlFor is the callback URL order registers.
func (r *receiver) urlFor(order string) string { return r.url + order }

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	order, ok := strings.CutPrefix(req.URL.Path, "/orders/")
	if req.Method != http.MethodPost || !ok {
		http.NotFound(w, req)
		return
	}
	id, body, err := r.verifier.VerifyRequest(req, 1<<20)
	var p callback.Payload
	if err == nil {
		err = json.Unmarshal(body, &p)
	}
	if err == nil && (p.CallbackID != id || p.BusinessKey != order) {
		err = fmt.Errorf("callback %s for order %q arrived at the URL of order %q", p.CallbackID, p.BusinessKey, order)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.rejected++
		http.Error(w, "refused", http.StatusUnauthorized)
		return
	}
	if _, seen := r.byID[id]; seen {
		r.dupes++
		w.WriteHeader(http.StatusNoContent)
		return
	}
	r.byID[id] = p
	r.byOrder[order] = append(r.byOrder[order], p.State)
	w.WriteHeader(http.StatusNoContent)
}

// reported returns the states reported for order.
func (r *receiver) reported(order string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.byOrder[order]...)
}

// counts returns the processed callbacks by state, the duplicates and the
// refused deliveries.
func (r *receiver) counts() (byState map[string]int, dupes, rejected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byState = map[string]int{}
	for _, p := range r.byID {
		byState[p.State]++
	}
	return byState, r.dupes, r.rejected
}

// awaitCallbacks waits (up to a minute) until the receiver has been told
// each order's state in want, and returns a problem line for each order it
// was not.
func (d *demo) awaitCallbacks(ctx context.Context, want map[string]string) []string {
	missing := func() []string {
		var out []string
		for order, state := range want {
			if !slices.Contains(d.receiver.reported(order), state) {
				out = append(out, order)
			}
		}
		slices.Sort(out)
		return out
	}
	deadline := time.Now().Add(time.Minute)
	for {
		left := missing()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var problems []string
			for _, order := range left {
				problems = append(problems, fmt.Sprintf("%s: no verified callback for %s (got %v)", order, want[order], d.receiver.reported(order)))
			}
			return problems
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
