package saga

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// Config configures an [Engine]. Pool, Definition and Hooks are required; the
// rest have defaults (see the field docs).
type Config struct {
	// Pool is the database the saga instance table and the runtime tables
	// (saga_outbox, saga_audit) live in. Methods that take a pgx.Tx use the
	// caller's transaction instead.
	Pool *pgxpool.Pool
	// Definition is the compiled saga type (see [sagadef.Compile]). Its
	// Table names the instance table.
	Definition *sagadef.Definition
	// Hooks are the user's business decisions.
	Hooks sagadef.Hooks
	// Registry resolves message types. Optional: when set, Handle refuses
	// (as a permanent failure) messages whose type it does not know.
	Registry *message.Registry
	// NewData returns an empty saga data message to decode stored data into.
	// Default: the type named by Definition.DataMessage in the global proto
	// registry.
	NewData func() proto.Message
	// Now is the clock. Default: time.Now. Tests inject a fixed clock to
	// drive timeouts.
	Now func() time.Time
	// NewID returns a new saga or message id; it must return a UUID string,
	// in any form uuid.Parse accepts: the engine uses its canonical form
	// (lower case, hyphens), as PostgreSQL's uuid columns return it, and
	// New calls NewID once to check it. Default: UUID v7.
	NewID func() string
	// Logger receives operational logs. Default: Telemetry.Logger, then
	// slog.Default().
	Logger *slog.Logger
	// Telemetry receives the engine's spans (saga.start, saga.transition,
	// saga.operate; emitted commands' outbox rows are their children) and
	// metrics. The zero value disables them.
	Telemetry telemetry.Providers
	// TimeoutBatch is how many due instances one FireTimeouts call of
	// RunTimeouts claims at most. Default: 100.
	TimeoutBatch int
	// StepTimeouts overrides the contract's step timeouts by step name, for a
	// deployment (or a test or soak run) that needs other bounds than the
	// contract's defaults. Unknown step names and non-positive durations are
	// refused. Nil keeps the contract's timeouts.
	StepTimeouts map[string]time.Duration
	// FailureBackoff is how long the scanner leaves an instance alone after
	// its timeout transition failed (a hook error), so one broken instance
	// cannot make the scanner spin. Default: 30 s.
	FailureBackoff time.Duration
	// MaxDeferrals is how many times in a row the scanner may fail to apply
	// an instance's due timeout or deadline before it sends the saga to
	// manual review (trigger sagadef.TriggerStuck, audited, with the last
	// error as the reason), so that a saga whose compensation cannot even
	// be sent does not wait silently forever. Default: 10 (about five
	// minutes at the default FailureBackoff): a hook or database failure
	// that lasts that long sends the saga to review too, where an
	// operator's retry resumes it. A transition that applies but leaves the
	// instance due counts as one deferral. -1 defers for ever.
	MaxDeferrals int
}

var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (c *Config) setDefaults() {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.NewID == nil {
		c.NewID = newUUIDv7
	} else {
		c.NewID = canonicalIDs(c.NewID)
	}
	c.Logger = c.Telemetry.LoggerOr(c.Logger, slog.Default())
	if c.TimeoutBatch <= 0 {
		c.TimeoutBatch = 100
	}
	if c.FailureBackoff <= 0 {
		c.FailureBackoff = 30 * time.Second
	}
	if c.MaxDeferrals == 0 {
		c.MaxDeferrals = 10
	}
	if c.NewData == nil && c.Definition != nil && c.Definition.DataMessage != "" {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(c.Definition.DataMessage))
		if err == nil {
			c.NewData = func() proto.Message { return mt.New().Interface() }
		}
	}
}

// Validate reports whether the configuration is usable. [New] calls it after
// applying defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if c.Hooks == nil {
		errs = append(errs, errors.New("Hooks is required"))
	}
	if c.Definition == nil {
		errs = append(errs, errors.New("Definition is required"))
	} else {
		if c.Definition.Name == "" {
			errs = append(errs, errors.New("Definition.Name is empty"))
		}
		if _, err := tableIdentifier(c.Definition.Table); err != nil {
			errs = append(errs, err)
		}
		if len(c.Definition.States) == 0 {
			errs = append(errs, fmt.Errorf("definition %s has no states: call Definition.Compile first", c.Definition.Name))
		}
		if c.NewData == nil {
			errs = append(errs, fmt.Errorf("NewData is required: data message %q is not in the global proto registry", c.Definition.DataMessage))
		}
	}
	if c.TimeoutBatch < 0 {
		errs = append(errs, errors.New("TimeoutBatch must not be negative"))
	}
	if c.MaxDeferrals < -1 {
		errs = append(errs, fmt.Errorf("MaxDeferrals is %d, want -1 (never give up) or more", c.MaxDeferrals))
	}
	if c.NewID != nil {
		if id := c.NewID(); uuid.Validate(id) != nil {
			errs = append(errs, fmt.Errorf("NewID returned %q, not a UUID", id))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("saga config: %w", err)
	}
	return nil
}

// tableIdentifier validates a table name ("table" or "schema.table") and
// returns it as a pgx identifier.
func tableIdentifier(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, errors.New("Definition.Table is empty")
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("Definition.Table %q: want table or schema.table", name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return nil, fmt.Errorf("Definition.Table %q: %q is not a plain SQL identifier", name, p)
		}
	}
	return pgx.Identifier(parts), nil
}

func newUUIDv7() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the system's random source fails; a v4 id
		// is as unique and keeps the engine going.
		return uuid.NewString()
	}
	return id.String()
}

// canonicalIDs returns newID with its UUIDs in canonical form. The ids
// stored in uuid columns (saga ids, the pending command's id) come back
// from PostgreSQL in that form, and replies are matched against the ids the
// engine sent: an upper-case id sent would never match. A value that is not
// a UUID is returned as it is (Validate refuses such a NewID).
func canonicalIDs(newID func() string) func() string {
	return func() string {
		raw := newID()
		if id, err := uuid.Parse(raw); err == nil {
			return id.String()
		}
		return raw
	}
}

// Engine runs the instances of one saga type. It is safe for concurrent use
// by many goroutines and many processes: the database serializes work on
// each instance. See the package documentation for the design.
type Engine struct {
	cfg      Config
	def      *sagadef.Definition
	table    string // quoted identifier
	terminal []string
	// clocked are the states a timeout or the deadline acts on (step,
	// group and compensating states) that this definition knows: the scanner claims
	// only those, so a state another release of the definition added is
	// left to that release's scanners.
	clocked   []string
	stateKind map[string]sagadef.StateKind
	q         queries
	tel       sagaTelemetry
	// relay is the relay of this process the engine's own transactions
	// hand their committed outbox rows to (HandOffTo); nil: none.
	relay atomic.Pointer[outbox.Relay]
}

// New returns an engine for cfg.Definition.
func New(cfg Config) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.StepTimeouts) > 0 {
		def, err := withStepTimeouts(cfg.Definition, cfg.StepTimeouts)
		if err != nil {
			return nil, err
		}
		cfg.Definition = def
	}
	ident, _ := tableIdentifier(cfg.Definition.Table)
	e := &Engine{
		cfg:       cfg,
		def:       cfg.Definition,
		table:     ident.Sanitize(),
		stateKind: make(map[string]sagadef.StateKind, len(cfg.Definition.States)),
	}
	for _, s := range cfg.Definition.States {
		e.stateKind[s.Name] = s.Kind
		switch s.Kind {
		case sagadef.StateKindTerminal:
			e.terminal = append(e.terminal, s.Name)
		case sagadef.StateKindStep, sagadef.StateKindGroup, sagadef.StateKindCompensating:
			e.clocked = append(e.clocked, s.Name)
		}
	}
	e.q = newQueries(e.table)
	tel, err := newSagaTelemetry(cfg.Telemetry, cfg.Definition, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("saga %s: %w", cfg.Definition.Name, err)
	}
	e.tel = tel
	return e, nil
}

// withStepTimeouts returns a copy of def whose steps named in timeouts wait
// that long instead. The compiled index refers to steps by position, so the
// copy stays compiled.
func withStepTimeouts(def *sagadef.Definition, timeouts map[string]time.Duration) (*sagadef.Definition, error) {
	c := *def
	c.Steps = slices.Clone(def.Steps)
	for _, name := range slices.Sorted(maps.Keys(timeouts)) {
		d := timeouts[name]
		i := slices.IndexFunc(c.Steps, func(s sagadef.Step) bool { return s.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("saga %s: step timeout override for unknown step %q", def.Name, name)
		}
		if d <= 0 {
			return nil, fmt.Errorf("saga %s: step timeout override for step %s is %s; it must be positive", def.Name, name, d)
		}
		c.Steps[i].Timeout = d
	}
	return &c, nil
}

// Definition returns the saga type the engine runs.
func (e *Engine) Definition() *sagadef.Definition { return e.def }

func (e *Engine) env() sagadef.Env {
	return sagadef.Env{Now: e.cfg.Now(), NewID: e.cfg.NewID, Hooks: e.cfg.Hooks}
}

func (e *Engine) isTerminal(state string) bool {
	return e.stateKind[state] == sagadef.StateKindTerminal
}
