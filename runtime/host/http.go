package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
)

// handle registers pattern on the host's mux, turning ServeMux's panic on a
// conflicting pattern into an error.
func (h *Host) handle(pattern string, handler http.Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("HTTP route %q: %v", pattern, p)
		}
	}()
	h.mux.Handle(pattern, handler)
	return nil
}

// serve mounts the host's endpoints and listens (so a taken port fails
// Start); launch serves.
func (h *Host) serve(r *running) error {
	if h.cfg.HTTPAddr == HTTPOff {
		return nil
	}
	var routes []error
	route := func(pattern string, handler http.Handler) { routes = append(routes, h.handle(pattern, handler)) }
	route("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	route("GET /readyz", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { h.ready(w, req, r) }))
	if h.metrics != nil {
		route("GET /metrics", h.metrics.MetricsHandler())
	}
	if len(h.cfg.AdminTokens) > 0 {
		reg, err := h.registry()
		if err != nil {
			return err
		}
		engines := make([]*saga.Engine, len(h.sagas))
		for i, s := range h.sagas {
			engines[i] = s.Engine
		}
		srv, err := admin.New(admin.Config{
			Pool: h.pool, Sagas: engines, Registry: reg, Tokens: h.cfg.AdminTokens, Logger: h.log, Now: h.cfg.Now,
			Tracer: h.cfg.Telemetry.Tracer,
		})
		if err != nil {
			return fmt.Errorf("admin server: %w", err)
		}
		h.mu.Lock()
		h.admin = srv
		h.mu.Unlock()
		route("/admin/", http.StripPrefix("/admin", srv))
	}
	for _, s := range h.sagas {
		base := "/sagas/" + s.Snake
		route("GET "+base+"/{id}", s.Engine.StatusHandler())
		if h.cfg.StartEndpoints {
			route("POST "+base, s.Engine.StartHandler(s.NewStart, func(id string) string { return base + "/" + id }))
		}
	}
	if err := errors.Join(routes...); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", h.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HTTP server: %w", err)
	}
	r.listener = ln
	r.server = &http.Server{
		Handler:           h.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      2 * time.Minute, // a bulk repair of the admin API is the longest answer
		IdleTimeout:       2 * time.Minute,
	}
	return nil
}

// registry merges the message types of everything registered, for the
// admin console's message views.
func (h *Host) registry() (*message.Registry, error) {
	reg, err := message.NewRegistry()
	if err != nil {
		return nil, err
	}
	for _, p := range h.participants {
		if err := reg.Add(p.Package.Messages...); err != nil {
			return nil, fmt.Errorf("message registry: %w", err)
		}
	}
	for _, s := range h.sagas {
		if err := reg.Add(s.Package.Messages...); err != nil {
			return nil, fmt.Errorf("message registry: %w", err)
		}
	}
	return reg, nil
}

// ready answers /readyz: 200 while the host runs, the database answers and
// both broker connections are up; 503 with the failing checks otherwise.
func (h *Host) ready(w http.ResponseWriter, req *http.Request, r *running) {
	checks := map[string]string{"host": "ok", "database": "ok", "broker": "ok"}
	ok := true
	if !r.ready.Load() {
		checks["host"], ok = "not running", false
	}
	ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
	defer cancel()
	if err := h.pool.Ping(ctx); err != nil {
		h.log.WarnContext(ctx, "readiness: database ping failed", "error", err)
		checks["database"], ok = "unreachable", false
	}
	if !r.pub.Connected() || !r.sub.Connected() {
		checks["broker"], ok = "reconnecting", false
	}
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, checks)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// httpAddr is the address the HTTP server listens on, for the start log.
func (h *Host) httpAddr(r *running) string {
	if r.listener == nil {
		return HTTPOff
	}
	return r.listener.Addr().String()
}

// Addr returns the address the HTTP server listens on once started (with
// the port the system chose for ":0"), or "" when it does not run.
func (h *Host) Addr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.run == nil || h.run.listener == nil {
		return ""
	}
	return h.run.listener.Addr().String()
}

// ReloadAdminTokens reads Config.AdminTokensFile again and gives the admin
// server its tokens: requests after it are checked against those only. A
// file that cannot be read or parsed is an error and the tokens in use
// stay. [Main] calls it on SIGHUP; the host also calls it when the file
// changes.
func (h *Host) ReloadAdminTokens() error {
	h.mu.Lock()
	srv := h.admin
	h.mu.Unlock()
	switch {
	case h.cfg.AdminTokensFile == "":
		return fmt.Errorf("host %s: no admin tokens file to reload (%s)", h.cfg.Service, EnvAdminTokensFile)
	case srv == nil:
		return fmt.Errorf("host %s: the admin server does not run", h.cfg.Service)
	}
	t, raw, err := readTokens(h.cfg.AdminTokensFile)
	h.mu.Lock()
	h.tokensRead = raw
	h.mu.Unlock()
	if err == nil {
		err = srv.SetTokens(t)
	}
	if err != nil {
		h.log.Error("admin tokens not reloaded; the tokens in use stay", "file", h.cfg.AdminTokensFile, "error", err)
		return fmt.Errorf("host %s: %w", h.cfg.Service, err)
	}
	h.log.Info("admin tokens reloaded", "file", h.cfg.AdminTokensFile, "tokens", t)
	return nil
}

// watchTokens reloads the admin tokens file whenever its content differs
// from what was last read, until ctx ends. Comparing content, not the
// modification time, sees a rewrite within the file system's timestamp
// granularity and one made before the watcher started.
func (h *Host) watchTokens(ctx context.Context) error {
	t := time.NewTicker(h.cfg.AdminTokensCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		raw, err := os.ReadFile(h.cfg.AdminTokensFile)
		h.mu.Lock()
		// An unreadable file is reloaded (and logged) once, not every tick.
		same := (err == nil && bytes.Equal(raw, h.tokensRead)) || (err != nil && h.tokensRead == nil)
		h.mu.Unlock()
		if same {
			continue
		}
		_ = h.ReloadAdminTokens() // logged; the tokens in use stay
	}
}
