package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/retry"
)

// ErrClosed is returned by Conn methods after Close.
var ErrClosed = errors.New("broker connection closed")

// ConnConfig tunes a Conn. The zero value is usable.
type ConnConfig struct {
	// TLS configures amqps:// connections. Nil uses the system roots and
	// the URL's host as server name.
	TLS *tls.Config
	// Name is advertised as the connection_name client property, so the
	// management UI shows which process a connection belongs to.
	Name string
	// Heartbeat is the AMQP heartbeat interval; 0 means 10 s. Heartbeats are
	// how a silently dead TCP connection is detected.
	Heartbeat time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered wait between
	// connection attempts; 0 means 100 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection loss and reconnect events (URLs redacted).
	// Nil discards them.
	Logger *slog.Logger
	// Meter receives the [MetricReconnects] counter (by connection Name).
	// Nil records nothing. Pass the same provider as telemetry.Providers.Meter.
	Meter metric.MeterProvider
}

// MetricReconnects counts broker connections lost and re-established, by
// connection name (attribute "saga.connection.name").
const MetricReconnects = "saga.broker.reconnects"

// meterScope is the instrumentation scope of the runtime's meters (the same
// as package telemetry's ScopeName; broker does not import telemetry, which
// would bring the database layer into the broker layer).
const meterScope = "github.com/protosaga/saga/runtime"

func (c *ConnConfig) setDefaults() {
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Conn is an AMQP connection that reconnects itself. After the broker closes
// the connection or the network drops it, Conn dials again with exponential
// backoff and jitter until it succeeds or Close is called. Channels belong
// to one underlying connection and die with it: callers notice through the
// channel's NotifyClose (or a failing operation) and ask Channel for a new
// one, which waits for the next live connection. Conn is safe for concurrent
// use.
type Conn struct {
	urls     []string // the nodes, in the order given
	redacted string   // every URL, redacted, comma-separated
	cfg      ConnConfig
	next     int // the index in urls to dial first; only connect uses it

	mu    sync.Mutex
	cur   *generation   // nil while reconnecting
	ready chan struct{} // closed when cur is set

	closed    chan struct{}
	closeOnce sync.Once
	done      chan struct{} // the supervisor has exited

	reconnects metric.Int64Counter // nil without cfg.Meter
}

// generation is one underlying connection.
type generation struct {
	conn *amqp.Connection
	lost chan struct{} // closed when conn is gone

	mu      sync.Mutex
	blocked string // why the broker blocked conn (a resource alarm); "" when it is not
}

// watchBlocked keeps g.blocked up to date until conn is gone.
func (g *generation) watchBlocked(blocks <-chan amqp.Blocking) {
	for b := range blocks { // closed with the connection
		reason := ""
		if b.Active {
			reason = b.Reason
			if reason == "" {
				reason = "no reason given"
			}
		}
		g.mu.Lock()
		g.blocked = reason
		g.mu.Unlock()
	}
}

// Blocked reports whether the broker has blocked the current connection
// (connection.blocked: a memory or disk alarm stops it reading from
// connections that publish), and why. A blocked connection takes no
// publish: written anyway, it fills the socket and holds the writer until
// the alarm clears.
func (c *Conn) Blocked() (reason string, blocked bool) {
	c.mu.Lock()
	g := c.cur
	c.mu.Unlock()
	if g == nil {
		return "", false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked, g.blocked != ""
}

// Connected reports whether c has a live connection now (false while it
// reconnects and after Close).
func (c *Conn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.closed:
		return false
	default:
	}
	return c.cur != nil
}

// Dial connects to the broker at url (amqp:// or amqps://) and keeps the
// connection alive until Close. The first connection is retried with
// backoff until ctx ends, so processes may start before the broker; refused
// credentials or vhost, a malformed URL and certificate errors fail at once.
// Errors and logs never contain the URL's password.
//
// url may list the nodes of a cluster, comma-separated. Conn then dials
// them in turn, starting with the first: a node that does not answer is
// passed over at once for the next, and the backoff applies after a round
// in which none answered. A lost connection is replaced by one to the node
// after the one that was lost, so that clients leave a node that died
// rather than wait for it.
func Dial(ctx context.Context, url string, cfg ConnConfig) (*Conn, error) {
	cfg.setDefaults()
	redacted := Redact(url)
	urls := splitURLs(url)
	for _, u := range urls {
		if _, err := amqp.ParseURI(u); err != nil {
			return nil, fmt.Errorf("dial %s: %w", Redact(u), err)
		}
	}
	c := &Conn{
		urls:     urls,
		redacted: redacted,
		cfg:      cfg,
		ready:    make(chan struct{}),
		closed:   make(chan struct{}),
		done:     make(chan struct{}),
	}
	if cfg.Meter != nil {
		counter, err := cfg.Meter.Meter(meterScope).Int64Counter(MetricReconnects, metric.WithUnit("{reconnect}"),
			metric.WithDescription("Broker connections lost and re-established."))
		if err != nil {
			return nil, fmt.Errorf("dial %s: reconnect counter: %w", redacted, err)
		}
		c.reconnects = counter
	}
	conn, err := c.connect(ctx, true)
	if err != nil {
		return nil, err
	}
	c.setCurrent(conn)
	go c.supervise()
	return c, nil
}

// Channel opens a channel on the current connection, waiting for a
// reconnect when there is none. It returns ctx's error when ctx ends first
// and ErrClosed after Close.
func (c *Conn) Channel(ctx context.Context) (*amqp.Channel, error) {
	for {
		c.mu.Lock()
		g, ready := c.cur, c.ready
		c.mu.Unlock()
		if g == nil {
			select {
			case <-ready:
				continue
			case <-c.closed:
				return nil, ErrClosed
			case <-ctx.Done():
				return nil, fmt.Errorf("open channel on %s: waiting for a connection: %w", c.redacted, ctx.Err())
			}
		}
		ch, err := openChannel(ctx, g.conn)
		if err == nil {
			return ch, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open channel on %s: %w", c.redacted, err)
		}
		if !g.conn.IsClosed() {
			return nil, fmt.Errorf("open channel on %s: %w", c.redacted, err)
		}
		// The connection died under us: wait for the supervisor to notice.
		select {
		case <-g.lost:
		case <-c.closed:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("open channel on %s: waiting for a connection: %w", c.redacted, ctx.Err())
		}
	}
}

// openChannel opens a channel on conn, giving up when ctx ends: a broker
// that stopped reading the connection (a resource alarm, a half-dead path)
// never answers the open. A channel opened after that is closed at once.
func openChannel(ctx context.Context, conn *amqp.Connection) (*amqp.Channel, error) {
	type opened struct {
		ch  *amqp.Channel
		err error
	}
	res := make(chan opened, 1)
	go func() {
		ch, err := conn.Channel()
		res <- opened{ch, err}
	}()
	select {
	case r := <-res:
		return r.ch, r.err
	case <-ctx.Done():
		go func() {
			if r := <-res; r.ch != nil {
				_ = r.ch.Close()
			}
		}()
		return nil, fmt.Errorf("waiting for the broker to open a channel: %w", ctx.Err())
	}
}

// Close closes the connection and stops reconnecting. Channels opened from
// it are closed too. Close is idempotent.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	<-c.done
	return nil
}

// String returns the redacted URL.
func (c *Conn) String() string { return c.redacted }

func (c *Conn) setCurrent(conn *amqp.Connection) *generation {
	g := &generation{conn: conn, lost: make(chan struct{})}
	go g.watchBlocked(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	c.mu.Lock()
	c.cur = g
	close(c.ready)
	c.mu.Unlock()
	return g
}

// supervise watches the current connection and replaces it when it is lost.
func (c *Conn) supervise() {
	defer close(c.done)
	for {
		c.mu.Lock()
		g := c.cur
		c.mu.Unlock()
		lost := g.conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-c.closed:
			_ = g.conn.Close()
			c.dropCurrent(g)
			return
		case reason := <-lost:
			c.dropCurrent(g)
			c.cfg.Logger.Warn("broker connection lost; reconnecting", "url", c.redacted, "reason", errString(reason))
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-c.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		conn, err := c.connect(ctx, false)
		cancel()
		if err != nil {
			// Only Close ends a reconnect loop (permanent errors are retried
			// too: credentials may be fixed while we wait).
			return
		}
		c.setCurrent(conn)
		c.cfg.Logger.Info("broker connection restored", "url", c.redacted)
		if c.reconnects != nil {
			c.reconnects.Add(context.Background(), 1, metric.WithAttributes(attribute.String("saga.connection.name", c.cfg.Name)))
		}
	}
}

func (c *Conn) dropCurrent(g *generation) {
	c.mu.Lock()
	if c.cur == g {
		c.cur = nil
		c.ready = make(chan struct{})
	}
	c.mu.Unlock()
	close(g.lost)
}

// connect dials until it succeeds or ctx ends, trying the nodes in turn
// from c.next; a connection made leaves c.next at the node after its own,
// for the next reconnect. During the first Dial, permanent errors end it at
// once; when reconnecting they are retried.
func (c *Conn) connect(ctx context.Context, first bool) (*amqp.Connection, error) {
	for attempt := 0; ; attempt++ {
		var err error
		for range c.urls {
			u := c.urls[c.next%len(c.urls)]
			c.next = (c.next + 1) % len(c.urls)
			var conn *amqp.Connection
			if conn, err = c.dial(u); err == nil {
				if len(c.urls) > 1 {
					c.cfg.Logger.Info("broker connection made", "url", Redact(u))
				}
				return conn, nil
			}
			err = fmt.Errorf("dial %s: %w", Redact(u), err)
			if first && permanent(err) {
				return nil, err
			}
			c.cfg.Logger.Debug("broker dial failed", "url", Redact(u), "attempt", attempt+1, "error", err)
		}
		t := time.NewTimer(retry.Backoff(attempt, c.cfg.MinBackoff, c.cfg.MaxBackoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-c.closed:
			t.Stop()
			return nil, ErrClosed
		case <-t.C:
		}
	}
}

// dial makes one connection to the node at u.
func (c *Conn) dial(u string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	if c.cfg.Name != "" {
		props.SetClientConnectionName(c.cfg.Name)
	}
	return amqp.DialConfig(u, amqp.Config{
		Heartbeat:       c.cfg.Heartbeat,
		TLSClientConfig: c.cfg.TLS,
		Properties:      props,
		Locale:          "en_US",
	})
}

// splitURLs returns the URLs of a comma-separated list, blanks removed.
func splitURLs(list string) []string {
	var urls []string
	for u := range strings.SplitSeq(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return []string{list} // empty: ParseURI reports it
	}
	return urls
}

// permanent reports dial errors that retrying cannot fix.
func permanent(err error) bool {
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	return errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) || errors.Is(err, amqp.ErrSASL) ||
		errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr)
}

// Redact returns url with its password replaced by "xxxxx" (each URL's, for
// a comma-separated list). A string that does not parse as a URL is
// replaced entirely, since it may contain a secret anywhere.
func Redact(rawURL string) string {
	if strings.Contains(rawURL, ",") {
		var out []string
		for u := range strings.SplitSeq(rawURL, ",") {
			out = append(out, Redact(strings.TrimSpace(u)))
		}
		return strings.Join(out, ",")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparseable URL>"
	}
	return u.Redacted()
}

// URLFromEnv returns the broker URL in environment variable name, checked
// to be an amqp:// or amqps:// URL, or a comma-separated list of such URLs
// (the nodes of a cluster; see Dial). Errors never contain the value.
func URLFromEnv(name string) (string, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return "", fmt.Errorf("broker URL: environment variable %s is empty or unset", name)
	}
	for _, u := range splitURLs(v) {
		if _, err := amqp.ParseURI(u); err != nil {
			return "", fmt.Errorf("broker URL in %s (%s): %w", name, Redact(u), err)
		}
	}
	return v, nil
}

func errString(err *amqp.Error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}
