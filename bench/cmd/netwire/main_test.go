package main

import (
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// seqpacket returns the two ends of a socket pair that keeps message
// boundaries, as a TUN device does: the wire's end and the namespace's end.
func seqpacket(t *testing.T) (wireEnd, nsEnd *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	for _, fd := range fds {
		require.NoError(t, syscall.SetNonblock(fd, true))
	}
	a, b := os.NewFile(uintptr(fds[0]), "wire"), os.NewFile(uintptr(fds[1]), "ns")
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// ipv4 is a minimal IPv4 packet from src to dst carrying payload.
func ipv4(src, dst string, payload string) []byte {
	b := make([]byte, 20, 20+len(payload))
	b[0] = 0x45
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	return append(b, payload...)
}

// TestForwardsByDestination checks that each packet reaches the namespace
// holding its destination address, unchanged, and that packets the wire
// cannot route are counted and not forwarded.
func TestForwardsByDestination(t *testing.T) {
	w := &wire{delay: 100 * time.Microsecond, byAddr: map[netip.Addr]*port{}}
	ns := map[string]*os.File{}
	for _, l := range []struct{ name, addr string }{{"pg", "10.9.0.2"}, {"mq", "10.9.0.3"}, {"app", "10.9.0.4"}} {
		wireEnd, nsEnd := seqpacket(t)
		p := &port{name: l.name, dev: wireEnd, queue: make(chan packet, 16)}
		w.ports = append(w.ports, p)
		w.byAddr[netip.MustParseAddr(l.addr)] = p
		ns[l.name] = nsEnd
	}
	for _, p := range w.ports {
		go w.deliver(p)
		go w.receive(p)
	}
	send := func(from string, pkt []byte) {
		_, err := ns[from].Write(pkt)
		require.NoError(t, err)
	}
	recv := func(at string) []byte {
		require.NoError(t, ns[at].SetReadDeadline(time.Now().Add(10*time.Second)))
		b := make([]byte, 2048)
		n, err := ns[at].Read(b)
		require.NoError(t, err, "read at %s", at)
		return b[:n]
	}

	toPG := ipv4("10.9.0.4", "10.9.0.2", "query")
	toMQ := ipv4("10.9.0.4", "10.9.0.3", "publish")
	reply := ipv4("10.9.0.2", "10.9.0.4", "rows")
	send("app", toPG)
	send("app", toMQ)
	require.Equal(t, toPG, recv("pg"))
	require.Equal(t, toMQ, recv("mq"))
	send("pg", reply)
	require.Equal(t, reply, recv("app"))

	send("app", ipv4("10.9.0.4", "10.9.0.9", "nobody")) // no namespace has it
	send("app", []byte{0x60, 0, 0, 0})                  // not IPv4
	require.Eventually(t, func() bool { return w.unknown.Load() == 2 }, 10*time.Second, time.Millisecond)
	require.EqualValues(t, 3, w.packets.Load())
	require.Zero(t, w.dropped.Load())

	rep := w.report()
	require.True(t, strings.Contains(rep, "3 packets forwarded, 0 dropped (queue full), 2 not forwarded"), rep)
}

func TestLinkFlag(t *testing.T) {
	var ls links
	require.NoError(t, ls.Set("saga-pg=10.1.2.3"))
	require.Equal(t, links{{"saga-pg", netip.MustParseAddr("10.1.2.3")}}, ls)
	require.Error(t, ls.Set("saga-pg"))
	require.Error(t, ls.Set("=10.1.2.3"))
	require.Error(t, ls.Set("saga-pg=::1"))
}
