package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to an AMQP broker so that a test can make
// the network path misbehave: Hold stops forwarding what the broker sends
// until it is released, Freeze stops forwarding both ways for good without
// closing anything (a half-dead path, or a broker that stopped reading a
// blocked connection), and Cut closes every connection.
type Proxy struct {
	// URL reaches the broker through the proxy.
	URL string

	mu      sync.Mutex
	held    bool
	release chan struct{}
	frozen  chan struct{}
	freeze  func()
	conns   []net.Conn
	ln      net.Listener
	carried int // connections accepted and forwarded
}

// NewProxy starts a proxy to amqpURL's broker until the test ends.
func NewProxy(t testing.TB, amqpURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("proxy to %s: %v", redact(amqpURL), err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy to %s: %v", redact(amqpURL), err)
	}
	target := u.Host
	u.Host = ln.Addr().String()
	frozen := make(chan struct{})
	p := &Proxy{URL: u.String(), release: make(chan struct{}), frozen: frozen, freeze: sync.OnceFunc(func() { close(frozen) }), ln: ln}
	t.Cleanup(func() {
		_ = ln.Close()
		p.Hold(false)
		p.Cut()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.carried++
			p.mu.Unlock()
			go p.pipe(s, c, false)
			go p.pipe(c, s, true)
		}
	}()
	return p
}

// Hold stops (on) or resumes forwarding what the broker sends.
func (p *Proxy) Hold(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held && !on {
		close(p.release)
		p.release = make(chan struct{})
	}
	p.held = on
}

// Freeze stops forwarding in both directions, for good.
func (p *Proxy) Freeze() { p.freeze() }

// Down stops the proxy for good, as a broker node that died: it accepts no
// connection any more and closes those it carries.
func (p *Proxy) Down() {
	_ = p.ln.Close()
	p.Cut()
}

// Carried returns how many connections the proxy has accepted and forwarded.
func (p *Proxy) Carried() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.carried
}

// Cut closes every connection the proxy carries.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// pipe copies src to dst until either fails; fromBroker data waits while
// held, and nothing goes through once frozen.
func (p *Proxy) pipe(dst io.Writer, src io.Reader, fromBroker bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for fromBroker {
			p.mu.Lock()
			held, release := p.held, p.release
			p.mu.Unlock()
			if !held {
				break
			}
			select {
			case <-release:
			case <-p.frozen:
			}
		}
		select {
		case <-p.frozen:
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
