package benv

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// Commands are the statement kinds the wire count breaks its total into, in
// report order; every other command tag counts as "other".
var Commands = []string{"BEGIN", "COMMIT", "ROLLBACK", "SELECT", "INSERT", "UPDATE", "DELETE", "other"}

// wireCounts counts the server's answers on every connection of one pool:
// one CommandComplete message per statement PostgreSQL executed, whichever
// API sent it — a single query, a multi-statement simple query, a pgx batch
// or a pgconn pipeline — and one ErrorResponse per statement that failed.
// Reading the server's answers rather than the client's calls counts what
// the server did, so no client path can be missed.
//
// It also counts round trips: the times a connection's client wrote after
// having read an answer since its last write (a connection's first write
// counts too). Writes with no answer read between them go out in one turn,
// however many statements they carry, so a pipeline or batch is one round
// trip and each wait for the server's answer before sending more is
// another: what a network's latency is paid for.
type wireCounts struct {
	byCommand  [8]atomic.Int64 // indexed like Commands
	errors     atomic.Int64
	roundTrips atomic.Int64
}

func (w *wireCounts) total() int64 {
	var n int64
	for i := range w.byCommand {
		n += w.byCommand[i].Load()
	}
	return n
}

func (w *wireCounts) reset() {
	for i := range w.byCommand {
		w.byCommand[i].Store(0)
	}
	w.errors.Store(0)
	w.roundTrips.Store(0)
}

// complete counts one CommandComplete whose tag starts with tag.
func (w *wireCounts) complete(tag []byte) {
	i := len(Commands) - 1
	for j, c := range Commands[:len(Commands)-1] {
		if len(tag) >= len(c) && string(tag[:len(c)]) == c && (len(tag) == len(c) || tag[len(c)] == ' ' || tag[len(c)] == 0) {
			i = j
			break
		}
	}
	w.byCommand[i].Add(1)
}

// dialFunc wraps dial so that every connection it makes counts what the
// server answers on it.
func (w *wireCounts) dialFunc(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &countedConn{Conn: c, counts: w}
		cc.answered.Store(true)
		return cc, nil
	}
}

// countedConn parses the backend messages it reads. Every message after
// the startup request is a type byte, a big-endian int32 length that counts
// itself, and a body; the connection is plaintext (Pool refuses TLS), so
// the stream parses from its first byte. pgconn reads a connection from one
// goroutine at a time, so the parser needs no lock; answered is shared
// between the reading and the writing goroutine.
type countedConn struct {
	net.Conn
	counts   *wireCounts
	p        backendParser
	answered atomic.Bool // the server answered since the client last wrote
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.feed(b[:n], c.counts)
	if n > 0 {
		c.answered.Store(true)
	}
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	if len(b) > 0 && c.answered.Swap(false) {
		c.counts.roundTrips.Add(1)
	}
	return c.Conn.Write(b)
}

// backendParser is a streaming parser of backend messages that keeps only
// what counting needs: the message type and the head of a CommandComplete
// tag.
type backendParser struct {
	hdr    [5]byte
	hdrN   int
	inBody bool
	left   int // body bytes still to read
	tag    [9]byte
	tagN   int
}

func (p *backendParser) feed(b []byte, w *wireCounts) {
	for len(b) > 0 {
		if !p.inBody {
			k := copy(p.hdr[p.hdrN:], b)
			p.hdrN += k
			b = b[k:]
			if p.hdrN < len(p.hdr) {
				return
			}
			p.hdrN, p.inBody, p.tagN = 0, true, 0
			p.left = int(binary.BigEndian.Uint32(p.hdr[1:])) - 4
			if p.left <= 0 {
				p.end(w)
			}
			continue
		}
		k := min(p.left, len(b))
		if p.hdr[0] == 'C' && p.tagN < len(p.tag) {
			p.tagN += copy(p.tag[p.tagN:], b[:k])
		}
		p.left -= k
		b = b[k:]
		if p.left == 0 {
			p.end(w)
		}
	}
}

func (p *backendParser) end(w *wireCounts) {
	p.inBody = false
	switch p.hdr[0] {
	case 'C': // CommandComplete
		w.complete(p.tag[:p.tagN])
	case 'E': // ErrorResponse
		w.errors.Add(1)
	}
}

// checkPlaintext refuses a connection configuration the wire count cannot
// read: with TLS the server's answers are encrypted.
func checkPlaintext(cfg *pgconn.Config) error {
	if cfg.TLSConfig != nil {
		return fmt.Errorf("counting statements on the wire needs a plaintext connection to %s: add sslmode=disable to the URL", cfg.Host)
	}
	for _, f := range cfg.Fallbacks {
		if f.TLSConfig != nil {
			return fmt.Errorf("counting statements on the wire needs a plaintext connection to %s: add sslmode=disable to the URL", f.Host)
		}
	}
	return nil
}
