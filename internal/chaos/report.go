package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// latencies computes, from the audit trail, each step's round trip (the
// transition that sent its command → the transition that applied its
// reply, across relay, broker, participant, relay and broker) and each
// ended saga's start-to-end latency.
func (r *run) latencies(rep *Report, sagas map[string]sagaRow, audits map[string][]auditRow) {
	steps := map[string][]time.Duration{}
	var ends []time.Duration
	var first, last time.Time
	ended := 0
	for _, sg := range sagas {
		trail := audits[sg.id]
		if len(trail) == 0 {
			continue
		}
		if first.IsZero() || trail[0].at.Before(first) {
			first = trail[0].at
		}
		prev := trail[0]
		version := int64(1)
		var end time.Time
		for _, a := range trail[1:] {
			if a.version != version+1 {
				continue
			}
			version = a.version
			if isReply(a.trigger) && isStepState(a.from) {
				d := a.at.Sub(prev.at)
				steps[a.from] = append(steps[a.from], d)
				steps["all steps"] = append(steps["all steps"], d)
			}
			prev = a
			switch a.to {
			case "COMPLETED", "FAILED", "CANCELLED", "MANUAL_REVIEW":
				end = a.at
			}
		}
		if !end.IsZero() {
			ended++
			if end.After(last) {
				last = end
			}
			if sg.state != "MANUAL_REVIEW" {
				ends = append(ends, end.Sub(trail[0].at))
			}
		}
	}
	for step, ds := range steps {
		rep.StepLatency[step] = summarize(ds)
	}
	rep.SagaLatency = summarize(ends)
	if span := last.Sub(first); span > 0 {
		rep.Throughput = float64(ended) / span.Seconds()
	}
}

// isStepState reports whether the saga waits on a step or a compensation in
// state (not in manual review or ended).
func isStepState(state string) bool {
	switch state {
	case "MANUAL_REVIEW", "COMPLETED", "FAILED", "CANCELLED":
		return false
	}
	return true
}

func isReply(trigger string) bool {
	switch {
	case trigger == "start", trigger == "timeout", trigger == "deadline", trigger == "stuck", strings.HasPrefix(trigger, "operator"):
		return false
	}
	return true
}

func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return Latency{N: len(ds), P50: q(0.50), P99: q(0.99), Max: ds[len(ds)-1]}
}

// figures fills in the fleet's counters and the memory summary.
func (r *run) figures(rep *Report) {
	faults, kills, starts := r.fleet.Counts()
	rep.Faults, rep.Kills, rep.NodeStarts = faults, kills, starts
	rep.Nodes = len(r.fleet.Procs())
	r.mu.Lock()
	rep.ServerRestarts = maps.Clone(r.restarts)
	r.mu.Unlock()
	for _, p := range r.fleet.Procs() {
		byInc := map[int][]RSSSample{}
		var incs []int
		for _, s := range p.Samples() {
			if _, ok := byInc[s.Incarnation]; !ok {
				incs = append(incs, s.Incarnation)
			}
			byInc[s.Incarnation] = append(byInc[s.Incarnation], s)
		}
		for _, inc := range incs {
			ss := byInc[inc]
			pr := ProcRSS{Node: p.Name, Incarnation: inc}
			pr.Life = ss[len(ss)-1].At.Sub(ss[0].At)
			for _, s := range ss {
				pr.Max = max(pr.Max, s.RSSKiB)
			}
			if len(ss) >= 20 {
				n := len(ss)
				pr.Early = median(ss[n/4 : n/2])
				pr.Late = median(ss[n-n/4:])
				pr.Growth = float64(pr.Late) / float64(max(pr.Early, 1))
				pr.LongEnough = pr.Life >= time.Minute
			}
			rep.RSS = append(rep.RSS, pr)
			// A leak grows with work; a heap settling after warm-up does
			// not double. 16 MiB of slack absorbs GC and allocator noise.
			if r.cfg.MaxRSSGrowth > 0 && pr.LongEnough && pr.Growth > r.cfg.MaxRSSGrowth && pr.Late-pr.Early > 16<<10 {
				rep.violate("node %s (incarnation %d): RSS grew from %d KiB to %d KiB over %s",
					p.Name, inc, pr.Early, pr.Late, pr.Life.Round(time.Second))
			}
		}
	}
}

func median(ss []RSSSample) int64 {
	v := make([]int64, len(ss))
	for i, s := range ss {
		v[i] = s.RSSKiB
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// String renders the report for people.
func (rep *Report) String() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("seed %d, %s", rep.Seed, rep.Duration.Round(time.Millisecond))
	p("sagas: %d started; final states %v; manual review %d", rep.Sagas, sortedMap(rep.States), rep.ManualReview)
	if len(rep.ReviewReasons) > 0 {
		p("manual review reasons: %v", sortedMap(rep.ReviewReasons))
	}
	p("nodes: %d (%d starts); kills %v; server restarts %v", rep.Nodes, rep.NodeStarts, sortedMap(rep.Kills), sortedMap(rep.ServerRestarts))
	p("faults injected: %v", sortedMap(rep.Faults))
	p("audit: %d rows, %d duplicates absorbed, %d late replies, %d conflicting", rep.AuditRows, rep.Duplicates, rep.Late, rep.Conflicting)
	p("outbox: %d rows, %d handed by consumers to their node's relay, %d leased more than once (published twice, or released unsent first); parked: %d %v",
		rep.OutboxRows, rep.HandedOff, rep.Redelivered, rep.Parked, sortedMap(rep.ParkedBy))
	p("callbacks: %d verified and processed, %d redelivered copies deduplicated by id, %d requests", rep.Callbacks, rep.CallbackDuplicates, rep.CallbackRequests)
	p("lost: %d; double effects: %d", rep.Lost, rep.DoubleEffects)
	for _, t := range slices.Sorted(maps.Keys(rep.Types)) {
		f := rep.Types[t]
		p("saga %s: %d started; final states %v; manual review %d; lost %d; double effects %d",
			t, f.Sagas, sortedMap(f.States), f.ManualReview, f.Lost, f.DoubleEffects)
	}
	p("throughput: %.1f sagas ended/s; saga latency (no manual review) %s", rep.Throughput, rep.SagaLatency)
	for _, step := range slices.Sorted(maps.Keys(rep.StepLatency)) {
		p("step round trip %-32s %s", step, rep.StepLatency[step])
	}
	for _, r := range rep.RSS {
		if r.LongEnough {
			p("rss %s#%d over %s: %d KiB → %d KiB (max %d KiB, ×%.2f)", r.Node, r.Incarnation, r.Life.Round(time.Second), r.Early, r.Late, r.Max, r.Growth)
		}
	}
	if len(rep.Violations) == 0 {
		p("invariants: all hold")
	} else {
		p("VIOLATIONS (%d):", len(rep.Violations))
		for _, v := range rep.Violations {
			p("  - %s", v)
		}
	}
	return b.String()
}

// String renders the distribution.
func (l Latency) String() string {
	if l.N == 0 {
		return "n=0"
	}
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", l.N, l.P50.Round(time.Millisecond), l.P99.Round(time.Millisecond), l.Max.Round(time.Millisecond))
}

func sortedMap(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
