package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/internal/termtext"
	"github.com/protosaga/saga/runtime/telemetry"
)

// securityHeaders sets headers every answer carries: no framing, no
// sniffing, no referrer, a content security policy that allows only this
// origin's own scripts and styles.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		next.ServeHTTP(w, r)
	})
}

// apiError is an error with its HTTP status and body.
type apiError struct {
	status int
	body   Error
}

func (e *apiError) Error() string { return e.body.Message }

func apiErr(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, body: Error{Code: code, Message: fmt.Sprintf(format, args...)}}
}

func badRequest(format string, args ...any) *apiError {
	return apiErr(http.StatusBadRequest, "bad_request", format, args...)
}

// endpoint wraps an API handler: authentication, permission, panics and
// errors become JSON answers, and one log line per request (never the
// Authorization header).
func (s *Server) endpoint(need Role, h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if s.cfg.Tracer != nil {
			ctx := telemetry.ContextWithTraceparent(r.Context(), r.Header.Get("traceparent"), r.Header.Get("tracestate"))
			ctx, span := s.cfg.Tracer.Tracer(telemetry.ScopeName).Start(ctx, "admin "+r.Pattern, trace.WithSpanKind(trace.SpanKindServer))
			defer span.End()
			r = r.WithContext(ctx)
		}
		client := s.cfg.ClientAddr(r)
		if locked, wait, first := s.limiter.locked(client); locked {
			secs := int(wait.Seconds()) + 1
			if first {
				s.cfg.Logger.WarnContext(r.Context(), "admin sign-ins refused: too many failed", "client", client,
					"failures", s.cfg.MaxFailedSignIns, "window", s.cfg.SignInWindow.String(), "retry_after_s", secs)
			}
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			writeJSON(w, http.StatusTooManyRequests, Error{Code: "rate_limited",
				Message: fmt.Sprintf("too many failed sign-ins from this address: try again in %d s", secs)})
			return
		}
		p, why := s.auth.Load().principal(r)
		if why != "" {
			failures := 0
			if why == unknownToken {
				failures = s.limiter.fail(client)
			}
			s.cfg.Logger.WarnContext(r.Context(), "admin sign-in failed", "reason", why, "client", client,
				"method", r.Method, "path", r.URL.Path, "failures", failures)
			w.Header().Set("WWW-Authenticate", `Bearer realm="saga-admin"`)
			writeJSON(w, http.StatusUnauthorized, Error{Code: "unauthenticated", Message: "a valid bearer token is required (Authorization: Bearer <token>)"})
			return
		}
		if !p.Role.allows(need) {
			s.cfg.Logger.WarnContext(r.Context(), "admin request forbidden", "principal", p.Name, "role", p.Role, "method", r.Method, "path", r.URL.Path)
			writeJSON(w, http.StatusForbidden, Error{Code: "forbidden", Message: fmt.Sprintf("principal %s has role %s; this needs role %s", p.Name, p.Role, need)})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		err := func() (err error) {
			defer func() {
				if v := recover(); v != nil {
					s.cfg.Logger.ErrorContext(r.Context(), "admin handler panic", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
					err = errors.New("handler panic")
				}
			}()
			return h(w, r)
		}()
		if err == nil {
			return
		}
		var ae *apiError
		if !errors.As(err, &ae) {
			s.cfg.Logger.ErrorContext(r.Context(), "admin request failed", "principal", p.Name, "method", r.Method, "path", r.URL.Path, "error", err)
			ae = apiErr(http.StatusInternalServerError, "internal", "internal error (see the server log)")
		}
		writeJSON(w, ae.status, ae.body)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, `{"code":"internal","error":"encode response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// decodeBody decodes a JSON request body into v, refusing unknown fields,
// trailing data and bodies over 64 KiB.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apiErr(http.StatusRequestEntityTooLarge, "too_large", "request body over %d bytes", maxBodyBytes)
		}
		if errors.Is(err, io.EOF) {
			return badRequest("request body is empty: send a JSON object")
		}
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: more than one value")
	}
	return nil
}

// query reads a request's query parameters, refusing unknown and repeated
// ones.
type query struct {
	vals map[string]string
}

func parseQuery(r *http.Request, allowed ...string) (query, error) {
	q := query{vals: map[string]string{}}
	for k, vs := range r.URL.Query() {
		if !slices.Contains(allowed, k) {
			return q, badRequest("unknown query parameter %q (allowed: %s)", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			return q, badRequest("query parameter %q given %d times", k, len(vs))
		}
		q.vals[k] = vs[0]
	}
	return q, nil
}

func (q query) str(k string) string { return q.vals[k] }

func (q query) boolean(k string) (bool, error) {
	v, ok := q.vals[k]
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest("%s=%q: want true or false", k, v)
	}
	return b, nil
}

// time parses an RFC 3339 time; nil when the parameter is absent.
func (q query) time(k string) (*time.Time, error) {
	v, ok := q.vals[k]
	if !ok || v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, badRequest("%s=%q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", k, v)
	}
	return &t, nil
}

func (q query) limit() (int, error) {
	v, ok := q.vals["limit"]
	if !ok || v == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, badRequest("limit=%q: want a whole number from 1 to %d", v, MaxPageSize)
	}
	return n, nil
}

// checkText validates a filter's text: PostgreSQL refuses NUL and invalid
// UTF-8 in text (SQLSTATE 22021), which would be a 500, not the caller's
// mistake it is.
func checkText(name, v string, maxBytes int) error {
	switch {
	case len(v) > maxBytes:
		return badRequest("%s: at most %d bytes", name, maxBytes)
	case !utf8.ValidString(v):
		return badRequest("%s: not valid UTF-8", name)
	case strings.ContainsRune(v, 0):
		return badRequest("%s: contains NUL", name)
	}
	return nil
}

// checkReason validates a repair's reason.
func checkReason(reason string) (string, error) {
	reason = strings.TrimSpace(reason)
	switch {
	case reason == "":
		return "", badRequest("reason is required: every repair records why")
	case len(reason) > MaxReasonLength:
		return "", badRequest("reason is %d bytes; at most %d", len(reason), MaxReasonLength)
	case strings.ContainsFunc(reason, func(r rune) bool { return termtext.IsControl(r) && r != '\t' }):
		return "", badRequest("reason contains control characters (C0 other than tab, DEL, C1, U+2028, U+2029)")
	}
	return reason, nil
}
