package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Role is what a token may do.
type Role string

// Roles. A repair token may also read.
const (
	// RoleRead may list and inspect sagas and parked messages.
	RoleRead Role = "read"
	// RoleRepair may also replay parked messages and run operator actions.
	RoleRepair Role = "repair"
)

// allows reports whether r grants need.
func (r Role) allows(need Role) bool {
	switch need {
	case RoleRead:
		return r == RoleRead || r == RoleRepair
	case RoleRepair:
		return r == RoleRepair
	}
	return false
}

// Principal is who a token belongs to. Its Name is recorded as the operator
// of every repair made with the token.
type Principal struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// Tokens maps bearer tokens to principals. Its String and LogValue never
// reveal a token.
type Tokens map[string]Principal

// EnvTokens is the environment variable ParseTokens' input is
// conventionally read from.
const EnvTokens = "SAGA_ADMIN_TOKENS"

// MinTokenLength is the shortest bearer token accepted, in bytes.
const MinTokenLength = 16

var principalName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)

// ParseTokens parses "name:role:token" entries separated by commas or
// whitespace, e.g. "alice:repair:<32 random chars>,dashboard:read:<...>".
// A token may contain ':' (everything after the second one is the token).
// Errors never quote a token.
func ParseTokens(spec string) (Tokens, error) {
	t := Tokens{}
	fields := strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' })
	for i, f := range fields {
		name, rest, ok1 := strings.Cut(f, ":")
		role, token, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("token entry %d: want name:role:token", i+1)
		}
		if _, dup := t[token]; dup {
			return nil, fmt.Errorf("token entry %d (%s): the same token is listed twice", i+1, name)
		}
		t[token] = Principal{Name: name, Role: Role(role)}
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// Validate reports every problem with t: no tokens, short tokens, invalid
// principal names or unknown roles. Errors name principals, never tokens.
func (t Tokens) Validate() error {
	if len(t) == 0 {
		return errors.New("no tokens: the admin API refuses every request without one")
	}
	var errs []error
	for tok, p := range t {
		if !principalName.MatchString(p.Name) {
			errs = append(errs, fmt.Errorf("principal name %q: want 1-64 of A-Z a-z 0-9 . _ @ + - (starting alphanumeric)", p.Name))
		}
		if p.Role != RoleRead && p.Role != RoleRepair {
			errs = append(errs, fmt.Errorf("principal %s: role %q: want %q or %q", p.Name, p.Role, RoleRead, RoleRepair))
		}
		if len(tok) < MinTokenLength {
			errs = append(errs, fmt.Errorf("principal %s: token shorter than %d bytes", p.Name, MinTokenLength))
		}
		if strings.TrimSpace(tok) != tok || strings.ContainsAny(tok, "\x00\r\n") {
			errs = append(errs, fmt.Errorf("principal %s: token contains whitespace or control characters", p.Name))
		}
	}
	return errors.Join(errs...)
}

// String describes t without its tokens.
func (t Tokens) String() string { return fmt.Sprintf("%d admin tokens (redacted)", len(t)) }

// LogValue keeps tokens out of structured logs.
func (t Tokens) LogValue() slog.Value { return slog.StringValue(t.String()) }

// authenticator checks bearer tokens against hashes of the configured ones,
// in time independent of which token (if any) matches. It is replaced as a
// whole when the tokens are reloaded (Server.SetTokens).
type authenticator struct {
	entries []authEntry
}

type authEntry struct {
	hash      [sha256.Size]byte
	principal Principal
}

func newAuthenticator(t Tokens) *authenticator {
	a := &authenticator{}
	for tok, p := range t {
		a.entries = append(a.entries, authEntry{hash: sha256.Sum256([]byte(tok)), principal: p})
	}
	return a
}

// Why a request was not authenticated.
const (
	noToken      = "no bearer token"
	unknownToken = "unknown token"
)

// principal returns the principal of the request's bearer token, or why
// there is none (noToken, unknownToken).
func (a *authenticator) principal(r *http.Request) (Principal, string) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, noToken
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return Principal{}, noToken
	}
	sum := sha256.Sum256([]byte(tok))
	var found Principal
	match := 0
	for _, e := range a.entries {
		eq := subtle.ConstantTimeCompare(sum[:], e.hash[:])
		if eq == 1 {
			found = e.principal
		}
		match |= eq
	}
	if match != 1 {
		return Principal{}, unknownToken
	}
	return found, ""
}

// signInLimiter counts failed sign-ins (requests with a token that matches
// none) per client address in fixed windows. An address that failed max
// times in a window is refused every request (429, Retry-After) until the
// window ends, whatever token it sends: a guess that would match is not
// even checked.
type signInLimiter struct {
	max    int // <= 0: no limit
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	clients map[string]*signInWindow
}

type signInWindow struct {
	start    time.Time
	failures int
	logged   bool // the lock of this window was logged
}

// maxTrackedClients bounds the limiter's memory: beyond it, windows that
// ended are dropped, and if none has, the oldest half.
const maxTrackedClients = 10000

func newSignInLimiter(max int, window time.Duration, now func() time.Time) *signInLimiter {
	return &signInLimiter{max: max, window: window, now: now, clients: map[string]*signInWindow{}}
}

// locked reports whether addr is refused now, for how long more, and
// whether this is the first refusal of its window (to log once).
func (l *signInLimiter) locked(addr string) (bool, time.Duration, bool) {
	if l.max <= 0 {
		return false, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.clients[addr]
	now := l.now()
	if !ok || now.Sub(w.start) >= l.window {
		return false, 0, false
	}
	if w.failures < l.max {
		return false, 0, false
	}
	first := !w.logged
	w.logged = true
	return true, w.start.Add(l.window).Sub(now), first
}

// fail counts a failed sign-in of addr and returns the count in its
// window.
func (l *signInLimiter) fail(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	w, ok := l.clients[addr]
	if !ok || now.Sub(w.start) >= l.window {
		if len(l.clients) >= maxTrackedClients {
			l.prune(now)
		}
		w = &signInWindow{start: now}
		l.clients[addr] = w
	}
	w.failures++
	return w.failures
}

// prune drops ended windows, and the older half of the rest if that is
// not enough.
func (l *signInLimiter) prune(now time.Time) {
	for a, w := range l.clients {
		if now.Sub(w.start) >= l.window {
			delete(l.clients, a)
		}
	}
	if len(l.clients) < maxTrackedClients {
		return
	}
	starts := make([]time.Time, 0, len(l.clients))
	for _, w := range l.clients {
		starts = append(starts, w.start)
	}
	slices.SortFunc(starts, time.Time.Compare)
	cut := starts[len(starts)/2]
	for a, w := range l.clients {
		if !w.start.After(cut) {
			delete(l.clients, a)
		}
	}
}

// clientAddr is the request's remote address without its port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
