package host

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/callback"
	"github.com/protosaga/saga/runtime/participant"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/schema"
	"github.com/protosaga/saga/runtime/telemetry"
)

// The environment variables [FromEnv] reads. They are the same names the
// project's scripts export and its README documents.
const (
	EnvPostgresURL = "SAGA_PG_URL"    // PostgreSQL URL (required unless Config.Pool is set)
	EnvAMQPURL     = "SAGA_AMQP_URL"  // RabbitMQ URL, amqp:// or amqps:// (required)
	EnvAMQPCA      = "SAGA_AMQP_CA"   // PEM file of the CA that signed the broker's certificate (amqps://); default: the system's roots
	EnvService     = "SAGA_SERVICE"   // service name; default: the executable's name
	EnvHTTPAddr    = "SAGA_HTTP_ADDR" // listen address of the host's HTTP server; "off" disables it
	EnvAdminTokens = admin.EnvTokens  // "name:role:token,..." (admin.ParseTokens); none: no admin API
	// EnvAdminTokensFile names a file holding the same list, read at start
	// and again when it changes or the process gets SIGHUP.
	EnvAdminTokensFile = "SAGA_ADMIN_TOKENS_FILE"
	EnvQueueType       = "SAGA_QUEUE_TYPE"  // "quorum" (default) or "classic"
	EnvRelays          = "SAGA_RELAYS"      // outbox relays in this process; default 1, 0 runs none
	EnvConcurrency     = "SAGA_CONCURRENCY" // workers per consumer; default consumer's (4)
	EnvMigrate         = "SAGA_MIGRATE"     // "false" skips applying migrations at Start
	EnvStart           = "SAGA_HTTP_START"  // "true" serves each saga's start endpoint (Config.StartEndpoints)
	EnvLogLevel        = "SAGA_LOG_LEVEL"   // debug, info (default), warn, error
	EnvLogFormat       = "SAGA_LOG_FORMAT"  // json (default) or text
	// EnvCallbackKeys, EnvCallbackAllow and EnvCallbackClients configure
	// the callback dispatcher (Config.Callbacks; see callback.FromEnv).
	EnvCallbackKeys    = callback.EnvKeys
	EnvCallbackAllow   = callback.EnvAllow
	EnvCallbackClients = callback.EnvClients
)

// DefaultHTTPAddr is where the host serves health, metrics, saga status and
// the admin API when Config.HTTPAddr is empty.
const DefaultHTTPAddr = "127.0.0.1:8080"

// HTTPOff as Config.HTTPAddr (or SAGA_HTTP_ADDR) runs no HTTP server.
const HTTPOff = "off"

// NoRelays as Config.Relays runs no outbox relay in this process (another
// process of the service relays the outbox).
const NoRelays = -1

// Config configures a [Host]. The zero value plus the two URLs is a working
// service: see the field docs for each default. [FromEnv] fills it from the
// environment.
type Config struct {
	// Service names this process's service in broker connection names,
	// relay lease owners and logs. Default: the executable's base name.
	Service string

	// PostgresURL is the database of the sagas, the runtime's tables and
	// the service's own tables. Required unless Pool is set. Unless it sets
	// pool_max_conns, the pool holds at most 4 connections per relay plus,
	// for eight consumers (participants, subscribers and sagas), Concurrency+1
	// each, plus 4 (48 with the defaults); connections are opened when
	// needed, so an idle host holds few. Start warns when what is registered
	// needs more.
	PostgresURL string
	// Pool is used instead of opening one from PostgresURL. The host does
	// not close a pool it did not open. Size it for the host: 4 per relay,
	// Concurrency+1 per registered participant or saga, plus your own use.
	Pool *pgxpool.Pool
	// AMQPURL is the broker, amqp:// or amqps://. Required.
	AMQPURL string
	// TLS configures amqps:// connections; nil uses the system roots.
	TLS *tls.Config

	// HTTPAddr is where the host serves /healthz, /readyz, /metrics, the
	// saga status endpoints (GET /sagas/<saga>/{id}) and, with AdminTokens,
	// the admin API and console under /admin/. Default DefaultHTTPAddr; HTTPOff serves nothing.
	HTTPAddr string
	// AdminTokens are the admin API's bearer tokens (admin.ParseTokens).
	// Without tokens the admin API and console are not served.
	AdminTokens admin.Tokens
	// AdminTokensFile names a file of admin tokens in admin.ParseTokens'
	// form, instead of AdminTokens: read at New, and read again while the
	// host runs when its content changes (checked every
	// AdminTokensCheck, default 5 s) and on [Host.ReloadAdminTokens]
	// ([Main] calls it on SIGHUP), so tokens rotate without a restart. A
	// file that no longer parses is logged and the tokens in use are kept.
	AdminTokensFile  string
	AdminTokensCheck time.Duration
	// StartEndpoints serves POST /sagas/<saga> for every registered saga
	// (the generated start handler: protojson body, 202 with the status
	// URL). Off by default: starting a saga is usually a decision of the
	// service's own API, in its own transaction (StartTx).
	StartEndpoints bool

	// QueueType is the type of every work queue the host declares. Default
	// broker.QueueQuorum.
	QueueType broker.QueueType
	// Retry is the retry policy of the consumers whose queue the contract
	// declares none for (a command's or subscribed event's retry option
	// wins for its queue); the work queues' tier queues are declared for
	// it. Every service sharing a queue must use the same one. Default
	// retry.Default().
	Retry retry.Policy
	// Relays is how many outbox relays this process runs. Default 1;
	// NoRelays runs none.
	Relays int
	// Concurrency, Prefetch and BatchSize tune every consumer (see
	// consumer.Config); zero takes the consumer's defaults. Queues
	// overrides them per queue.
	Concurrency, Prefetch, BatchSize int
	// Queues overrides the consumer tuning of single queues, by queue name.
	Queues map[string]QueueTuning
	// DrainTimeout bounds the consumers' graceful shutdown (see
	// consumer.Config.DrainTimeout). Default 30 s.
	DrainTimeout time.Duration
	// TimeoutScanInterval is how often each saga's timeout scanner looks
	// for due instances. Default 1 s.
	TimeoutScanInterval time.Duration
	// StepTimeouts overrides contract step timeouts, by saga full name and
	// then step name (saga.Config.StepTimeouts).
	StepTimeouts map[string]map[string]time.Duration
	// Callbacks, when set, runs a callback dispatcher in this process
	// (package callback) that delivers the HTTP callbacks the sagas'
	// contracts declare; it starts and stops with the relays. Its Pool,
	// Logger and Telemetry default to the host's. Nil runs none (another
	// process of the service dispatches).
	Callbacks *callback.Config
	// RelayLease, KeepPublished and KeepClaims are passed to the relays and
	// consumers (outbox.RelayConfig.LeaseDuration, .KeepPublished,
	// consumer.Config.KeepClaims); zero takes their defaults. A
	// participant's consumer prunes the service's once records under
	// KeepClaims (participant.PruneOnce), as the others prune their inbox
	// claims.
	RelayLease, KeepPublished, KeepClaims time.Duration

	// SkipMigrations leaves the database as it is at Start: apply the
	// runtime's, the sagas' and your migrations with another tool first.
	SkipMigrations bool
	// Migrations are the service's own tables, applied after the runtime's
	// and the sagas' migrations at Start.
	Migrations []schema.Source

	// ParticipantMiddleware wraps every registered participant's command
	// handling (service is the contract's owner name), outside the
	// once-per-command guard: for instrumentation, or for fault injection in
	// tests (fail before the effect, hold or duplicate the reply). Nil wraps
	// nothing. The participants' queues claim nothing in the inbox: the
	// once record, which names the message id, drops a redelivery
	// (runtime/participant). A middleware that succeeds without calling
	// next has its delivery claimed in the inbox instead, and a redelivery
	// of it fails permanently rather than applying its effects twice.
	ParticipantMiddleware func(service string, next participant.Func) participant.Func
	// Now is the sagas' clock (step timeouts, deadlines). Default time.Now.
	Now func() time.Time
	// Logger receives the host's and the runtime's logs. Default: JSON on
	// standard error at Info, with saga and message ids and redaction
	// (telemetry.NewLogHandler).
	Logger *slog.Logger
	// Telemetry receives the runtime's spans and metrics. When its Meter is
	// nil and the HTTP server runs, the host exports metrics in the
	// Prometheus format at /metrics, with the Go runtime's and the
	// process's, under service.name Service. When its Tracer is nil, the
	// host uses one that records no spans but gives every saga start,
	// message and admin request a W3C trace id: messages carry it
	// (traceparent) and every log line about them says it (trace_id).
	Telemetry telemetry.Providers
}

// QueueTuning overrides the consumer tuning of one queue; zero fields keep
// the host's.
type QueueTuning struct {
	Concurrency, Prefetch, BatchSize int
}

// FromEnv returns the configuration the environment describes (the Env*
// variables), read through getenv (os.Getenv in a program). Unset
// variables leave their field's default.
func FromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	var errs []error
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	cfg.PostgresURL = get(EnvPostgresURL)
	cfg.AMQPURL = get(EnvAMQPURL)
	cfg.Service = get(EnvService)
	cfg.HTTPAddr = get(EnvHTTPAddr)
	if s := get(EnvAdminTokens); s != "" {
		t, err := admin.ParseTokens(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvAdminTokens, err))
		}
		cfg.AdminTokens = t
	}
	cfg.AdminTokensFile = get(EnvAdminTokensFile)
	if cfg.AdminTokensFile != "" && get(EnvAdminTokens) != "" {
		errs = append(errs, fmt.Errorf("set %s or %s, not both", EnvAdminTokens, EnvAdminTokensFile))
	}
	if s := get(EnvQueueType); s != "" {
		cfg.QueueType = broker.QueueType(s)
	}
	intVar := func(name string, dst *int, zero int) {
		s := get(name)
		if s == "" {
			return
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a non-negative integer", name, s))
			return
		}
		if n == 0 {
			n = zero
		}
		*dst = n
	}
	intVar(EnvRelays, &cfg.Relays, NoRelays)
	intVar(EnvConcurrency, &cfg.Concurrency, 0)
	if s := get(EnvStart); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvStart, s))
		}
		cfg.StartEndpoints = b
	}
	if s := get(EnvMigrate); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvMigrate, s))
		}
		cfg.SkipMigrations = !b
	}
	if level, format := get(EnvLogLevel), get(EnvLogFormat); level != "" || format != "" {
		logger, err := loggerFromEnv(level, format)
		if err != nil {
			errs = append(errs, err)
		}
		cfg.Logger = logger
	}
	if cb, err := callback.FromEnv(get); err != nil {
		errs = append(errs, err)
	} else {
		cfg.Callbacks = cb
	}
	if path := get(EnvAMQPCA); path != "" {
		pem, err := os.ReadFile(path)
		roots := x509.NewCertPool()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", EnvAMQPCA, err))
		case !roots.AppendCertsFromPEM(pem):
			errs = append(errs, fmt.Errorf("%s=%q: no PEM certificate in the file", EnvAMQPCA, path))
		default:
			cfg.TLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		}
	}
	return cfg, errors.Join(errs...)
}

// loggerFromEnv builds the default logger with the given level and format
// ("" takes info and json).
func loggerFromEnv(level, format string) (*slog.Logger, error) {
	var errs []error
	var lv slog.Level
	if level != "" {
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want debug, info, warn or error", EnvLogLevel, level))
		}
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "", "json":
		h = slog.NewJSONHandler(os.Stderr, opts)
	case "text":
		h = slog.NewTextHandler(os.Stderr, opts)
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want json or text", EnvLogFormat, format))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return slog.New(telemetry.NewLogHandler(h, telemetry.LogOptions{})), nil
}

// setDefaults fills the zero fields of c with their defaults.
func (c *Config) setDefaults() {
	if c.Service == "" {
		c.Service = strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.QueueType == "" {
		c.QueueType = broker.QueueQuorum
	}
	if c.Retry.IsZero() {
		c.Retry = retry.Default()
	}
	if c.Relays == 0 {
		c.Relays = 1
	}
	if c.TimeoutScanInterval == 0 {
		c.TimeoutScanInterval = time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = c.Telemetry.Logger
	}
	if c.Logger == nil {
		c.Logger, _ = loggerFromEnv("", "") // the defaults cannot fail
	}
	if c.AdminTokensCheck <= 0 {
		c.AdminTokensCheck = 5 * time.Second
	}
}

// readTokens reads an admin tokens file (admin.ParseTokens' form) and
// returns its tokens and the bytes it read (nil when it could not read).
// Errors name the file, never a token.
func readTokens(path string) (admin.Tokens, []byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("admin tokens file: %w", err)
	}
	t, err := admin.ParseTokens(string(raw))
	if err != nil {
		return nil, raw, fmt.Errorf("admin tokens file %s: %w", path, err)
	}
	return t, raw, nil
}

// Validate reports every problem with c, after defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Pool == nil && c.PostgresURL == "" {
		errs = append(errs, fmt.Errorf("no database: set %s or Config.PostgresURL (or Config.Pool)", EnvPostgresURL))
	}
	if c.AMQPURL == "" {
		errs = append(errs, fmt.Errorf("no broker: set %s or Config.AMQPURL", EnvAMQPURL))
	}
	if c.HTTPAddr != HTTPOff {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("HTTP address %q: want host:port or %q: %w", c.HTTPAddr, HTTPOff, err))
		}
	}
	switch c.QueueType {
	case broker.QueueQuorum, broker.QueueClassic:
	default:
		errs = append(errs, fmt.Errorf("queue type %q: want %q or %q", c.QueueType, broker.QueueQuorum, broker.QueueClassic))
	}
	if c.Relays < NoRelays {
		errs = append(errs, fmt.Errorf("relays %d: want a positive count or NoRelays", c.Relays))
	}
	for name, d := range map[string]time.Duration{
		"drain timeout": c.DrainTimeout, "timeout scan interval": c.TimeoutScanInterval, "relay lease": c.RelayLease,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %s is negative", name, d))
		}
	}
	if c.Concurrency < 0 || c.Prefetch < 0 || c.BatchSize < 0 {
		errs = append(errs, errors.New("concurrency, prefetch and batch size must not be negative"))
	}
	for q, t := range c.Queues {
		if t.Concurrency < 0 || t.Prefetch < 0 || t.BatchSize < 0 {
			errs = append(errs, fmt.Errorf("queue %s: concurrency, prefetch and batch size must not be negative", q))
		}
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("retry policy: %w", err))
	}
	if len(c.AdminTokens) > 0 {
		if err := c.AdminTokens.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("admin tokens: %w", err))
		}
		if c.AdminTokensFile != "" {
			errs = append(errs, errors.New("admin tokens: set AdminTokens or AdminTokensFile, not both"))
		}
	}
	return errors.Join(errs...)
}

// tuning returns the consumer tuning of queue.
func (c *Config) tuning(queue string) QueueTuning {
	t := QueueTuning{Concurrency: c.Concurrency, Prefetch: c.Prefetch, BatchSize: c.BatchSize}
	if o, ok := c.Queues[queue]; ok {
		if o.Concurrency != 0 {
			t.Concurrency = o.Concurrency
		}
		if o.Prefetch != 0 {
			t.Prefetch = o.Prefetch
		}
		if o.BatchSize != 0 {
			t.BatchSize = o.BatchSize
		}
	}
	return t
}
