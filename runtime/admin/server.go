package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/admin/internal/diagram"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/saga"
	"github.com/protosaga/saga/runtime/sagadef"
)

// Config configures a Server. Pool, Sagas and Tokens are required.
type Config struct {
	// Pool is the database holding the saga tables and the runtime's
	// tables (saga_audit, saga_outbox, saga_parked).
	Pool *pgxpool.Pool
	// Sagas are the engines of the saga types the server shows and
	// repairs; operator actions go through them.
	Sagas []*saga.Engine
	// Registry decodes message bodies for display. Optional: each engine's
	// own registry is consulted too. Types neither knows are shown by size.
	Registry *message.Registry
	// Tokens are the accepted bearer tokens (see ParseTokens). Never logged.
	Tokens Tokens
	// Logger receives request and repair logs. Default: slog.Default().
	Logger *slog.Logger
	// Now is the clock (stuck detection, replay timestamps). Default: time.Now.
	Now func() time.Time
	// StuckGrace is how far past due a saga must be to be listed as stuck
	// (saga.StuckRule). Default: saga.DefaultStuckGrace, as the
	// saga.instances.stuck gauge; give both the same value. Negative: none.
	StuckGrace time.Duration
	// MaxFailedSignIns is how many requests with an unknown token one
	// client address may make in SignInWindow; beyond, every API request
	// from it is answered 429 until the window ends. Default
	// DefaultMaxFailedSignIns; negative: no limit.
	MaxFailedSignIns int
	// SignInWindow is the window of MaxFailedSignIns. Default one minute.
	SignInWindow time.Duration
	// ClientAddr names a request's client for the sign-in limit and the
	// logs. Default: the connection's remote address without its port.
	// Behind a reverse proxy, return the address the proxy vouches for.
	ClientAddr func(*http.Request) string
	// Tracer, when set, traces every API request (continuing a W3C
	// traceparent header): a repair's log lines and the messages it sends
	// carry its trace id.
	Tracer trace.TracerProvider
}

// DefaultMaxFailedSignIns is Config.MaxFailedSignIns' default.
const DefaultMaxFailedSignIns = 10

// Limits.
const (
	// DefaultPageSize and MaxPageSize bound list pages (?limit=).
	DefaultPageSize = 50
	MaxPageSize     = 200
	// DefaultBulk and MaxBulk bound bulk actions (max).
	DefaultBulk = 100
	MaxBulk     = 500
	// MaxReasonLength bounds a repair's reason, in bytes.
	MaxReasonLength = 1000
	maxBodyBytes    = 64 << 10
	// maxTimelineRows bounds each table's rows in one timeline.
	maxTimelineRows = 1000
)

// TriggerReplay is the audit trigger of a parked-message replay (a saga_audit
// row without state change, written with the operator and reason).
const TriggerReplay = "operator.replay"

// Server is the admin HTTP API and web console. It is an http.Handler: the
// JSON API lives under /api/, the console at / (relative links, so it can be
// mounted under a prefix with http.StripPrefix).
type Server struct {
	cfg     Config
	auth    atomic.Pointer[authenticator]
	limiter *signInLimiter
	sagas   []*sagaType // in Config order
	byName  map[string]*sagaType
	handler http.Handler
}

// sagaType is one served saga type with what its queries need.
type sagaType struct {
	engine *saga.Engine
	def    *sagadef.Definition
	table  string // quoted identifier
	// stuck decides which of its instances are stuck.
	stuck saga.StuckRule
	// sensitive is the union of the sensitive field paths of every message
	// the definition names; unknown lists names not in any registry.
	sensitive []string
	unknown   []string
}

// New validates cfg and returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StuckGrace == 0 {
		cfg.StuckGrace = saga.DefaultStuckGrace
	}
	if cfg.MaxFailedSignIns == 0 {
		cfg.MaxFailedSignIns = DefaultMaxFailedSignIns
	}
	if cfg.SignInWindow <= 0 {
		cfg.SignInWindow = time.Minute
	}
	if cfg.ClientAddr == nil {
		cfg.ClientAddr = clientAddr
	}
	var errs []error
	if cfg.Pool == nil {
		errs = append(errs, errors.New("admin: Pool is required"))
	}
	if len(cfg.Sagas) == 0 {
		errs = append(errs, errors.New("admin: Sagas is empty"))
	}
	if err := cfg.Tokens.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("admin: Tokens: %w", err))
	}
	s := &Server{cfg: cfg, byName: map[string]*sagaType{}, limiter: newSignInLimiter(cfg.MaxFailedSignIns, cfg.SignInWindow, cfg.Now)}
	s.auth.Store(newAuthenticator(cfg.Tokens))
	for i, e := range cfg.Sagas {
		if e == nil {
			errs = append(errs, fmt.Errorf("admin: Sagas[%d] is nil", i))
			continue
		}
		t, err := s.newSagaType(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := s.byName[t.def.Name]; dup {
			errs = append(errs, fmt.Errorf("admin: saga type %s is listed twice", t.def.Name))
			continue
		}
		s.byName[t.def.Name] = t
		s.sagas = append(s.sagas, t)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

func (s *Server) newSagaType(e *saga.Engine) (*sagaType, error) {
	def := e.Definition()
	if def == nil || !def.Compiled() {
		return nil, errors.New("admin: an engine's definition is not compiled")
	}
	parts := strings.Split(def.Table, ".")
	t := &sagaType{engine: e, def: def, table: pgx.Identifier(parts).Sanitize()}
	t.stuck = saga.NewStuckRule(def, s.cfg.StuckGrace)
	seen := map[string]bool{}
	for _, name := range messageNames(def) {
		if seen[name] {
			continue
		}
		seen[name] = true
		info, ok := s.lookupWith(e, name)
		if !ok {
			t.unknown = append(t.unknown, name)
			continue
		}
		for _, p := range info.SensitiveFields {
			if !slices.Contains(t.sensitive, p) {
				t.sensitive = append(t.sensitive, p)
			}
		}
	}
	return t, nil
}

// messageNames lists every message type a definition names.
func messageNames(def *sagadef.Definition) []string {
	names := []string{def.StartMessage}
	for _, st := range def.Steps {
		names = append(names, st.Command, st.Compensation, st.CompensationReply)
		names = append(names, st.SuccessReplies...)
		names = append(names, st.FailureReplies...)
		names = append(names, st.CompensationFailureReplies...)
	}
	return slices.DeleteFunc(names, func(n string) bool { return n == "" })
}

// lookup finds a message type in the configured registry or any engine's.
func (s *Server) lookup(fullName string) (*message.Info, bool) {
	return s.lookupWith(nil, fullName)
}

func (s *Server) lookupWith(extra *saga.Engine, fullName string) (*message.Info, bool) {
	if s.cfg.Registry != nil {
		if in, ok := s.cfg.Registry.Lookup(fullName); ok {
			return in, true
		}
	}
	if extra != nil {
		if r := extra.Registry(); r != nil {
			if in, ok := r.Lookup(fullName); ok {
				return in, true
			}
		}
	}
	for _, t := range s.sagas {
		if r := t.engine.Registry(); r != nil {
			if in, ok := r.Lookup(fullName); ok {
				return in, true
			}
		}
	}
	return nil, false
}

// SetTokens replaces the accepted bearer tokens, for rotating them without
// a restart: requests after it are checked against tokens only. Invalid
// tokens (Tokens.Validate) are refused and the current ones kept.
func (s *Server) SetTokens(tokens Tokens) error {
	if err := tokens.Validate(); err != nil {
		return fmt.Errorf("admin: tokens: %w", err)
	}
	s.auth.Store(newAuthenticator(tokens))
	s.cfg.Logger.Info("admin tokens replaced", "tokens", tokens)
	return nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// principalKey carries the authenticated principal in a request context.
type principalKey struct{}

func principalOf(ctx context.Context) Principal {
	p, _ := ctx.Value(principalKey{}).(Principal)
	return p
}

func (s *Server) routes() http.Handler {
	api := http.NewServeMux()
	routes := []struct {
		method, path string
		role         Role
		h            func(http.ResponseWriter, *http.Request) error
	}{
		{http.MethodGet, "/api/whoami", RoleRead, s.handleWhoAmI},
		{http.MethodGet, "/api/types", RoleRead, s.handleTypes},
		{http.MethodGet, "/api/types/{type}/diagram.svg", RoleRead, s.handleDiagram},
		{http.MethodGet, "/api/sagas", RoleRead, s.handleListSagas},
		{http.MethodGet, "/api/sagas/{id}", RoleRead, s.handleTimeline},
		{http.MethodPost, "/api/sagas/{id}/{action}", RoleRepair, s.handleAction},
		{http.MethodPost, "/api/bulk/sagas/{action}", RoleRepair, s.handleBulk},
		{http.MethodGet, "/api/parked", RoleRead, s.handleListParked},
		{http.MethodGet, "/api/parked/{id}", RoleRead, s.handleParked},
		{http.MethodPost, "/api/parked/{id}/replay", RoleRepair, s.handleReplay},
		{http.MethodPost, "/api/bulk/parked/replay", RoleRepair, s.handleBulkReplay},
		{http.MethodPost, "/api/parked/{id}/dismiss", RoleRepair, s.handleDismiss},
		{http.MethodPost, "/api/bulk/parked/dismiss", RoleRepair, s.handleBulkDismiss},
		{http.MethodGet, "/api/callbacks", RoleRead, s.handleListCallbacks},
		{http.MethodPost, "/api/callbacks/{id}/replay", RoleRepair, s.handleReplayCallback},
		{http.MethodGet, "/api/stats", RoleRead, s.handleStats},
		{http.MethodGet, "/api/search", RoleRead, s.handleSearch},
		{http.MethodGet, "/api/operator-log", RoleRead, s.handleOperatorLog},
	}
	for _, rt := range routes {
		api.Handle(rt.method+" "+rt.path, s.endpoint(rt.role, rt.h))
		// The path with any other method: 405, not the catch-all's 404.
		allow := rt.method
		if rt.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		api.Handle(rt.path, s.endpoint(RoleRead, func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Allow", allow)
			return apiErr(http.StatusMethodNotAllowed, "method_not_allowed", "%s takes %s only", rt.path, allow)
		}))
	}
	api.Handle("/api/", s.endpoint(RoleRead, func(http.ResponseWriter, *http.Request) error {
		return apiErr(http.StatusNotFound, "not_found", "no such API endpoint")
	}))

	root := http.NewServeMux()
	root.Handle("/api/", api)
	root.Handle("/", consoleHandler())
	return securityHeaders(root)
}

func (s *Server) handleWhoAmI(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, WhoAmI{Principal: principalOf(r.Context())})
	return nil
}

func (s *Server) handleTypes(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	out := make([]SagaType, 0, len(s.sagas))
	for _, t := range s.sagas {
		out = append(out, SagaType{
			Name: t.def.Name, Table: t.def.Table,
			States: stateViews(t.def, "", nil), Steps: stepViews(t.def), Mermaid: t.def.Mermaid(),
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handleDiagram answers GET /api/types/{type}/diagram.svg: the saga type's
// state diagram (see package diagram), with the state named by ?current
// highlighted and those in ?visited (comma-separated) marked.
func (s *Server) handleDiagram(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "current", "visited")
	if err != nil {
		return err
	}
	name := r.PathValue("type")
	t, ok := s.byName[name]
	if !ok {
		return apiErr(http.StatusNotFound, "not_found", "no saga type %q (served: %s)", name, strings.Join(s.typeNames(), ", "))
	}
	opts := diagram.Options{Current: q.str("current")}
	if v := q.str("visited"); v != "" {
		opts.Visited = strings.Split(v, ",")
	}
	svg, err := diagram.SVG(t.def, opts)
	if errors.Is(err, sagadef.ErrUnknownState) {
		return badRequest("%v", err)
	}
	if err != nil {
		return fmt.Errorf("diagram of %s: %w", name, err)
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(svg)
	return nil
}

func stateViews(def *sagadef.Definition, current string, visited map[string]bool) []StateView {
	out := make([]StateView, 0, len(def.States))
	for _, st := range def.States {
		out = append(out, StateView{Name: st.Name, Kind: st.Kind.String(), Step: st.Step,
			Current: st.Name == current, Visited: visited[st.Name]})
	}
	return out
}

func stepViews(def *sagadef.Definition) []StepView {
	out := make([]StepView, 0, len(def.Steps))
	for _, st := range def.Steps {
		v := StepView{
			Name: st.Name, Role: st.Role.String(), Command: st.Command, External: st.External,
			SuccessReplies: st.SuccessReplies, FailureReplies: st.FailureReplies, Compensation: st.Compensation,
			OnTimeout: st.OnTimeout.String(), MaxAttempts: max(st.MaxAttempts, 1), Late: st.Late.String(),
		}
		if st.Timeout > 0 {
			v.Timeout = st.Timeout.String()
		}
		out = append(out, v)
	}
	return out
}
