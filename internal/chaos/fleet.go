package chaos

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/protosaga/saga/runtime/callback"
)

// Fleet runs node processes of the soak binary and keeps them running: a
// supervisor restarts every process that dies (killed by the driver, at a
// crash point or at random) until the fleet stops.
type Fleet struct {
	bin    string
	logDir string
	logf   func(format string, args ...any)

	mu       sync.Mutex
	procs    []*Proc
	stopping bool
	faults   map[string]int
	kills    map[string]int // by reason: a crash point, or "random"
	starts   int
	wg       sync.WaitGroup
}

// NewFleet returns a fleet running bin (the soak binary), with each process's
// log in logDir.
func NewFleet(bin, logDir string, logf func(format string, args ...any)) *Fleet {
	return &Fleet{bin: bin, logDir: logDir, logf: logf, faults: map[string]int{}, kills: map[string]int{}}
}

// Proc is one supervised node process, across its incarnations.
type Proc struct {
	Name string
	f    *Fleet
	cfg  NodeConfig
	arm  func(incarnation int) map[CrashPoint]int

	mu          sync.Mutex
	pid         int
	incarnation int
	ready       chan struct{}
	exited      chan struct{}
	armed       bool
	samples     []RSSSample
}

// RSSSample is a process's resident set size at one moment.
type RSSSample struct {
	Incarnation int
	At          time.Time
	RSSKiB      int64
}

// Add starts a supervised process. arm, when not nil, arms crash points for
// each incarnation (1 = the first start).
func (f *Fleet) Add(ctx context.Context, cfg NodeConfig, arm func(incarnation int) map[CrashPoint]int) *Proc {
	p := &Proc{Name: cfg.Name, f: f, cfg: cfg, arm: arm}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		p.supervise(ctx)
	}()
	return p
}

// Procs returns the fleet's processes.
func (f *Fleet) Procs() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Proc(nil), f.procs...)
}

func (f *Fleet) isStopping() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopping
}

func (p *Proc) supervise(ctx context.Context) {
	for {
		if p.f.isStopping() || ctx.Err() != nil {
			return
		}
		exited, err := p.start()
		if err != nil {
			p.f.logf("%s: start: %v", p.Name, err)
			if !sleep(ctx, time.Second) {
				return
			}
			continue
		}
		select {
		case <-exited:
		case <-ctx.Done():
			return
		}
		if p.f.isStopping() {
			return
		}
		// Restart after a pause, as an orchestrator would.
		if !sleep(ctx, time.Duration(300+rand.IntN(700))*time.Millisecond) {
			return
		}
	}
}

func (p *Proc) start() (<-chan struct{}, error) {
	p.mu.Lock()
	p.incarnation++
	inc := p.incarnation
	p.mu.Unlock()
	cfg := p.cfg
	if p.arm != nil {
		cfg.Crash = p.arm(inc)
	}
	logf, err := os.OpenFile(filepath.Join(p.f.logDir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "--- incarnation %d, crash points %v\n", inc, cfg.Crash)
	cmd := exec.Command(p.f.bin, append([]string{"node"}, cfg.Args()...)...)
	if cfg.CallbackKeys != "" {
		cmd.Env = append(os.Environ(), callback.EnvKeys+"="+cfg.CallbackKeys)
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	ready, exited := make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.pid, p.ready, p.exited, p.armed = cmd.Process.Pid, ready, exited, len(cfg.Crash) > 0
	p.mu.Unlock()
	p.f.mu.Lock()
	p.f.starts++
	p.f.mu.Unlock()
	go func() {
		defer close(exited)
		defer logf.Close()
		sc := bufio.NewScanner(out)
		readyOnce := sync.OnceFunc(func() { close(ready) })
		for sc.Scan() {
			kind, arg, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case LineReady:
				readyOnce()
			case LineCrash:
				p.kill("crash:" + arg)
			case LineFault:
				p.f.mu.Lock()
				p.f.faults[arg]++
				p.f.mu.Unlock()
			}
		}
		err := cmd.Wait()
		fmt.Fprintf(logf, "--- incarnation %d exited: %v\n", inc, err)
		p.mu.Lock()
		p.pid = 0
		p.mu.Unlock()
	}()
	return exited, nil
}

// kill SIGKILLs the current incarnation, counting the kill under reason.
func (p *Proc) kill(reason string) bool {
	p.mu.Lock()
	pid := p.pid
	p.mu.Unlock()
	if pid == 0 {
		return false
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return false
	}
	p.f.mu.Lock()
	p.f.kills[reason]++
	p.f.mu.Unlock()
	p.f.logf("%s (pid %d): SIGKILL (%s)", p.Name, pid, reason)
	return true
}

// Kill SIGKILLs the process now, wherever it is.
func (p *Proc) Kill() bool { return p.kill("random") }

// Armed reports whether the current incarnation was started with crash
// points armed.
func (p *Proc) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.armed
}

// WaitReady waits until the current incarnation reported READY.
func (p *Proc) WaitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		ready, exited, pid := p.ready, p.exited, p.pid
		p.mu.Unlock()
		if ready == nil || pid == 0 {
			if !sleep(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
			continue
		}
		select {
		case <-ready:
			return nil
		case <-exited:
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", p.Name, ctx.Err())
		}
	}
}

// PID returns the current incarnation's process id (0 while none runs).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Samples returns the RSS samples taken so far.
func (p *Proc) Samples() []RSSSample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]RSSSample(nil), p.samples...)
}

// SampleRSS records every running process's resident set size every
// interval until ctx ends.
func (f *Fleet) SampleRSS(ctx context.Context, every time.Duration) {
	for sleep(ctx, every) {
		for _, p := range f.Procs() {
			p.mu.Lock()
			pid, inc := p.pid, p.incarnation
			p.mu.Unlock()
			if pid == 0 {
				continue
			}
			kib, err := RSS(pid)
			if err != nil {
				continue
			}
			p.mu.Lock()
			p.samples = append(p.samples, RSSSample{Incarnation: inc, At: time.Now(), RSSKiB: kib})
			p.mu.Unlock()
		}
	}
}

// Stop stops every process gracefully (SIGTERM, then SIGKILL after
// timeout) and waits for the supervisors to end.
func (f *Fleet) Stop(timeout time.Duration) {
	f.mu.Lock()
	f.stopping = true
	procs := append([]*Proc(nil), f.procs...)
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			p.mu.Lock()
			pid, exited := p.pid, p.exited
			p.mu.Unlock()
			if pid == 0 || exited == nil {
				return
			}
			_ = syscall.Kill(pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(timeout):
				f.logf("%s (pid %d): did not stop within %s; SIGKILL", p.Name, pid, timeout)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				<-exited
			}
		})
	}
	wg.Wait()
	f.wg.Wait()
}

// Counts returns the faults the nodes reported (by kind), the kills (by
// reason) and how many processes were started.
func (f *Fleet) Counts() (faults, kills map[string]int, starts int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	faults, kills = map[string]int{}, map[string]int{}
	for k, v := range f.faults {
		faults[k] = v
	}
	for k, v := range f.kills {
		kills[k] = v
	}
	return faults, kills, f.starts
}

// RSS reads a process's resident set size from /proc.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// CPUTime reads a process's user + system CPU time from /proc.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are fixed.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(fields[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	const ticksPerSecond = 100 // USER_HZ, fixed at 100 for /proc on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
