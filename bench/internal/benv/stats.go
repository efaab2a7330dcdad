package benv

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// Sample is a point-in-time reading of the counters a measurement reports as
// deltas.
type Sample struct {
	At time.Time
	// Commits is xact_commit of the run's database (every committed
	// transaction, read-only ones included) and of the databases of the
	// peer being counted (CountPeer).
	Commits int64
	// WALSyncs is pg_stat_wal.wal_sync: WAL flushes of the whole cluster
	// (other databases included).
	WALSyncs int64
	// Self is this process's user+system CPU.
	Self time.Duration
	// Postgres is the CPU of the PostgreSQL server: the postmaster, its
	// live children and the children it has reaped.
	Postgres time.Duration
	// Rabbit is the CPU of the RabbitMQ node (beam.smp).
	Rabbit time.Duration
	// Peer is the CPU of the peer's server process being counted
	// (CountPeer), such as the Temporal server.
	Peer time.Duration
	// Network is the CPU of the process that emulates the network between
	// separate hosts (scripts/hosts.sh's netwire, EnvNetworkPID).
	Network time.Duration
	// NetworkOK says whether Network could be read.
	NetworkOK bool
	// PostgresOK, RabbitOK and PeerOK say whether the server CPU could be
	// read (the servers must run on this machine).
	PostgresOK, RabbitOK, PeerOK bool
	// Rows is the rows inserted, updated and deleted per table of the run's
	// database (pg_stat_user_tables n_tup_ins, n_tup_upd, n_tup_del, summed
	// over the measurements' schemas), by table name.
	Rows map[string]RowOps
}

// RowOps counts a table's row operations.
type RowOps struct{ Ins, Upd, Del int64 }

// Total is the sum of the three.
func (r RowOps) Total() int64 { return r.Ins + r.Upd + r.Del }

// RowsSince returns the row operations per table between earlier and s,
// tables without any left out.
func (s Sample) RowsSince(earlier Sample) map[string]RowOps {
	out := map[string]RowOps{}
	for t, r := range s.Rows {
		e := earlier.Rows[t]
		d := RowOps{Ins: r.Ins - e.Ins, Upd: r.Upd - e.Upd, Del: r.Del - e.Del}
		if d != (RowOps{}) {
			out[t] = d
		}
	}
	return out
}

// Delta is the difference of two samples.
type Delta struct {
	Elapsed                      time.Duration
	Commits, WALSyncs            int64
	Self, Postgres               time.Duration
	Rabbit, Peer                 time.Duration
	PostgresOK, RabbitOK, PeerOK bool
	Network                      time.Duration
	NetworkOK                    bool
}

// Sub returns s - earlier.
func (s Sample) Sub(earlier Sample) Delta {
	return Delta{
		Elapsed:    s.At.Sub(earlier.At),
		Commits:    s.Commits - earlier.Commits,
		WALSyncs:   s.WALSyncs - earlier.WALSyncs,
		Self:       s.Self - earlier.Self,
		Postgres:   s.Postgres - earlier.Postgres,
		Rabbit:     s.Rabbit - earlier.Rabbit,
		Peer:       s.Peer - earlier.Peer,
		PostgresOK: s.PostgresOK && earlier.PostgresOK,
		RabbitOK:   s.RabbitOK && earlier.RabbitOK,
		PeerOK:     s.PeerOK && earlier.PeerOK,
		Network:    s.Network - earlier.Network,
		NetworkOK:  s.NetworkOK && earlier.NetworkOK,
	}
}

// Sample reads every counter. PostgreSQL publishes a backend's statistics
// when it goes idle, at most once a second: call Settle before the final
// sample of a measurement.
func (e *Env) Sample(ctx context.Context) (Sample, error) {
	s := Sample{At: time.Now()}
	dbs := append([]string{e.dbName}, e.peer.databases...)
	if err := e.db.QueryRow(ctx, `SELECT sum(pg_stat_get_db_xact_commit(oid))::bigint FROM pg_database WHERE datname = ANY($1)`,
		dbs).Scan(&s.Commits); err != nil {
		return s, fmt.Errorf("read xact_commit of %v: %w", dbs, err)
	}
	if err := e.db.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&s.WALSyncs); err != nil {
		return s, fmt.Errorf("read pg_stat_wal: %w", err)
	}
	rows, err := e.db.Query(ctx, `SELECT relname, sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_del)::bigint
FROM pg_stat_user_tables GROUP BY relname`)
	if err != nil {
		return s, fmt.Errorf("read pg_stat_user_tables: %w", err)
	}
	s.Rows = map[string]RowOps{}
	var name string
	var r RowOps
	for rows.Next() {
		if err := rows.Scan(&name, &r.Ins, &r.Upd, &r.Del); err != nil {
			rows.Close()
			return s, fmt.Errorf("read pg_stat_user_tables: %w", err)
		}
		s.Rows[name] = r
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("read pg_stat_user_tables: %w", err)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if pm, err := e.postmasterPID(ctx); err == nil {
		s.Postgres, s.PostgresOK = treeCPU(pm)
	}
	if pid, err := e.rabbitPID(ctx); err == nil {
		s.Rabbit, s.RabbitOK = procCPU(pid, false)
	}
	if e.peer.pid != 0 {
		s.Peer, s.PeerOK = procCPU(e.peer.pid, true)
	}
	if e.networkPID != 0 {
		s.Network, s.NetworkOK = procCPU(e.networkPID, false)
	}
	return s, nil
}

// peer is what Sample counts of a peer's own server (CountPeer).
type peer struct {
	label     string
	pid       int
	databases []string
}

// CountPeer makes Sample count, until the returned function is called, the
// commits of databases next to the run's database and the CPU of process
// pid (0: none) as Sample.Peer. label names the process in reports
// (PeerLabel).
func (e *Env) CountPeer(label string, pid int, databases ...string) (stop func()) {
	e.peer = peer{label: label, pid: pid, databases: databases}
	return func() { e.peer = peer{} }
}

// PeerLabel names the process CountPeer counts, or is empty.
func (e *Env) PeerLabel() string { return e.peer.label }

// Settle waits until PostgreSQL has published the statistics of
// transactions that just ended (backends report at most once a second).
func Settle() { time.Sleep(1100 * time.Millisecond) }

// postmasterPID is the parent of one of our backends.
func (e *Env) postmasterPID(ctx context.Context) (int, error) {
	var backend int
	if err := e.db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	st, err := readStat(backend)
	if err != nil {
		return 0, err
	}
	return st.ppid, nil
}

// rabbitPID asks the management API for the node's OS process id.
func (e *Env) rabbitPID(ctx context.Context) (int, error) {
	var nodes []struct {
		OSPid string `json:"os_pid"`
	}
	if err := e.rabbitAPI(ctx, http.MethodGet, "/nodes?columns=os_pid", nil, &nodes); err != nil {
		return 0, err
	}
	if len(nodes) == 0 {
		return 0, fmt.Errorf("no RabbitMQ node listed")
	}
	return strconv.Atoi(nodes[0].OSPid)
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// readStat parses /proc/PID/stat (fields after the parenthesised command).
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime..cstime fields 14..17.
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	num := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return procStat{ppid: int(num(1)), utime: num(11), stime: num(12), cutime: num(13), cstime: num(14)}, nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// procCPU is one process's CPU, with its reaped children's when children.
func procCPU(pid int, children bool) (time.Duration, bool) {
	st, err := readStat(pid)
	if err != nil {
		return 0, false
	}
	n := st.utime + st.stime
	if children {
		n += st.cutime + st.cstime
	}
	return ticks(n), true
}

// treeCPU is the CPU of pid, of its reaped children and of its live
// children (PostgreSQL backends are children of the postmaster).
func treeCPU(pid int) (time.Duration, bool) {
	total, ok := procCPU(pid, true)
	if !ok {
		return 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return total, true
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(child)
		if err != nil || st.ppid != pid {
			continue
		}
		total += ticks(st.utime + st.stime)
	}
	return total, true
}

// LoadAvg returns /proc/loadavg's first three fields.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return strings.TrimSpace(string(b))
	}
	return strings.Join(f[:3], " ")
}

// VHostPath is the vhost name escaped for management API paths.
func (v *VHost) VHostPath() string { return url.PathEscape(v.Name) }

// RoundTrips are percentiles of a client's round trips to PostgreSQL.
type RoundTrips struct{ P50, P99 time.Duration }

// RoundTrip times n `SELECT 1` round trips to PostgreSQL on one
// connection: the network between this process and the server, as the
// measurements see it.
func (e *Env) RoundTrip(ctx context.Context, n int) (RoundTrips, error) {
	conn, err := e.db.Acquire(ctx)
	if err != nil {
		return RoundTrips{}, fmt.Errorf("round trip: acquire: %w", err)
	}
	defer conn.Release()
	ds := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			return RoundTrips{}, fmt.Errorf("round trip: %w", err)
		}
		ds = append(ds, time.Since(t))
	}
	slices.Sort(ds)
	return RoundTrips{P50: ds[len(ds)/2], P99: ds[len(ds)*99/100]}, nil
}
