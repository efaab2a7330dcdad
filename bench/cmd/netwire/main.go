// Command netwire joins network namespaces into one network whose every
// packet takes a fixed one-way delay: the links of scripts/hosts.sh, where
// PostgreSQL, RabbitMQ and the services run in namespaces of their own as on
// separate hosts.
//
// The kernels of these machines have no netem (CONFIG_NET_SCH_NETEM is not
// set and no module can be loaded), nor the fq qdisc or BPF action that
// could delay packets by timestamp, so the delay is made here, in user
// space: each namespace has a TUN device (made by the caller, addressed in
// one subnet), netwire reads every IPv4 packet a namespace sends on it and
// writes it, after the delay, to the TUN device of the namespace that holds
// the destination address. A round trip between two namespaces takes twice
// the delay plus netwire's own forwarding time; netwire measures and
// reports the one-way time it actually added, its CPU and the packets it
// dropped (a destination queue of 16384 packets that overflows).
//
//	netwire -delay 250us -dev sw0 -link pgns=10.77.0.2 -link mqns=10.77.0.3 -link appns=10.77.0.4 -ready FILE -stats FILE
//
// It runs until SIGTERM or SIGINT, then writes its statistics to -stats.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "netwire: %v\n", err)
		os.Exit(1)
	}
}

// links is the -link flag: namespace=IPv4 address, repeated.
type links []link

type link struct {
	ns   string
	addr netip.Addr
}

func (l *links) String() string { return fmt.Sprint(*l) }

func (l *links) Set(s string) error {
	ns, a, ok := strings.Cut(s, "=")
	if !ok || ns == "" {
		return fmt.Errorf("%q: want NAMESPACE=IPv4", s)
	}
	addr, err := netip.ParseAddr(a)
	if err != nil || !addr.Is4() {
		return fmt.Errorf("%q: %s is not an IPv4 address", s, a)
	}
	*l = append(*l, link{ns, addr})
	return nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("netwire", flag.ContinueOnError)
	delay := fs.Duration("delay", 250*time.Microsecond, "one-way delay of every packet (half the round trip)")
	dev := fs.String("dev", "sw0", "name of the TUN device in every namespace")
	ready := fs.String("ready", "", "file written once every device is attached")
	statsPath := fs.String("stats", "", "file the statistics are written to at exit (default: stderr)")
	var ls links
	fs.Var(&ls, "link", "NAMESPACE=IPv4: a namespace and the address its TUN device has (repeat for each)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(ls) < 2 {
		return errors.New("want at least two -link")
	}
	if *delay < 0 {
		return errors.New("-delay must not be negative")
	}
	w := &wire{delay: *delay, byAddr: map[netip.Addr]*port{}}
	for _, l := range ls {
		f, err := openTUN(l.ns, *dev)
		if err != nil {
			return err
		}
		p := &port{name: l.ns, dev: f, queue: make(chan packet, 16384)}
		w.ports = append(w.ports, p)
		w.byAddr[l.addr] = p
	}
	for _, p := range w.ports {
		go w.deliver(p)
		go w.receive(p)
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte("ready\n"), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", *ready, err)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	report := w.report()
	if *statsPath == "" {
		fmt.Fprint(os.Stderr, report)
		return nil
	}
	if err := os.WriteFile(*statsPath, []byte(report), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", *statsPath, err)
	}
	return nil
}

type packet struct {
	buf  *[]byte
	n    int
	got  time.Time
	due  time.Time
	from *port
}

// port is one namespace's TUN device and the queue of packets bound for it.
type port struct {
	name  string
	dev   *os.File
	queue chan packet
}

type wire struct {
	delay   time.Duration
	ports   []*port
	byAddr  map[netip.Addr]*port
	bufs    sync.Pool
	packets atomic.Int64
	dropped atomic.Int64 // queue full
	unknown atomic.Int64 // not IPv4, or to an address no namespace has
	mu      sync.Mutex
	added   [2000]int64 // one-way time added, in 10 µs buckets (the last: 20 ms or more)
}

// receive reads the packets namespace p sends and queues each for the
// namespace of its destination.
func (w *wire) receive(p *port) {
	for {
		bp, _ := w.bufs.Get().(*[]byte)
		if bp == nil {
			b := make([]byte, 65536)
			bp = &b
		}
		n, err := p.dev.Read(*bp)
		if err != nil {
			fmt.Fprintf(os.Stderr, "netwire: read from %s: %v\n", p.name, err)
			return
		}
		now := time.Now()
		b := (*bp)[:n]
		if n < 20 || b[0]>>4 != 4 {
			w.unknown.Add(1)
			w.bufs.Put(bp)
			continue
		}
		dst, ok := w.byAddr[netip.AddrFrom4([4]byte(b[16:20]))]
		if !ok {
			w.unknown.Add(1)
			w.bufs.Put(bp)
			continue
		}
		select {
		case dst.queue <- packet{buf: bp, n: n, got: now, due: now.Add(w.delay), from: p}:
			w.packets.Add(1)
		default:
			w.dropped.Add(1)
			w.bufs.Put(bp)
		}
	}
}

// deliver writes the packets queued for p once each is due. It sleeps on a
// thread of its own with clock_nanosleep and a timer slack of 1 µs: the Go
// scheduler's timers round waits under a millisecond up to about one.
func (w *wire) deliver(p *port) {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0) // best effort: the default slack is 50 µs
	for pk := range p.queue {
		if wait := time.Until(pk.due); wait > 0 {
			ts := syscall.NsecToTimespec(int64(wait))
			for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
			}
		}
		if _, err := p.dev.Write((*pk.buf)[:pk.n]); err != nil {
			fmt.Fprintf(os.Stderr, "netwire: write to %s: %v\n", p.name, err)
		}
		added := time.Since(pk.got)
		w.bufs.Put(pk.buf)
		i := min(int(added/(10*time.Microsecond)), len(w.added)-1)
		w.mu.Lock()
		w.added[i]++
		w.mu.Unlock()
	}
}

func (w *wire) report() string {
	w.mu.Lock()
	hist := w.added
	w.mu.Unlock()
	var total int64
	for _, c := range hist {
		total += c
	}
	pct := func(q float64) string {
		if total == 0 {
			return "—"
		}
		want := int64(q * float64(total))
		var seen int64
		for i, c := range hist {
			seen += c
			if seen > want {
				return (time.Duration(i+1) * 10 * time.Microsecond).String()
			}
		}
		return "≥ 20ms"
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	names := make([]string, 0, len(w.ports))
	for _, p := range w.ports {
		names = append(names, p.name)
	}
	sort.Strings(names)
	return fmt.Sprintf("netwire: namespaces %s; delay set %s one way (%s round trip)\n"+
		"netwire: %d packets forwarded, %d dropped (queue full), %d not forwarded (not IPv4 or no such address)\n"+
		"netwire: one-way time added per packet: p50 ≤ %s, p99 ≤ %s (10 µs buckets)\n"+
		"netwire: its own CPU %s (%.1f µs per packet)\n",
		strings.Join(names, ", "), w.delay, 2*w.delay,
		w.packets.Load(), w.dropped.Load(), w.unknown.Load(),
		pct(0.5), pct(0.99), cpu.Round(time.Millisecond), float64(cpu.Microseconds())/float64(max(total, 1)))
}

// openTUN attaches to the TUN device dev of network namespace ns (made by
// `ip -n NS tuntap add dev DEV mode tun`): the attach happens on a thread
// moved into the namespace, and the descriptor keeps the device once the
// thread is back.
func openTUN(ns, dev string) (*os.File, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("open own network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := setns(target); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter namespace %s: %w", ns, err)
	}
	fd, openErr := attach(dev)
	if err := setns(orig); err != nil {
		// The thread stays locked, so the runtime ends it with the
		// goroutine instead of reusing it in the wrong namespace.
		return nil, fmt.Errorf("leave namespace %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	if openErr != nil {
		return nil, fmt.Errorf("TUN device %s in namespace %s: %w", dev, ns, openErr)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("TUN device %s in namespace %s: nonblocking: %w", dev, ns, err)
	}
	return os.NewFile(uintptr(fd), ns+"/"+dev), nil
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// attach opens /dev/net/tun and binds it to the existing device dev, as a
// TUN device without packet information (each read is one IP packet).
func attach(dev string) (int, error) {
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(dev)
	if err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("device name %q: %w", dev, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF: %w", err)
	}
	return fd, nil
}
