package golang

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"

	"github.com/protosaga/saga/internal/gen/model"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

// Binding is one queue binding of a package's topology.
type Binding struct{ Queue, Exchange, RoutingKey string }

// PackageTopology is what a Go package declares on the broker: the
// exchanges its messages are published to (and those its queues bind to),
// the work queues of its participants and sagas, and their bindings.
type PackageTopology struct {
	Exchanges []broker.Exchange
	Queues    []string
	Bindings  []Binding
	// Retry holds the retry policies the contract declares, by queue.
	Retry map[string]retry.Policy
}

// Topology computes the topology of p, sorted.
func Topology(p *model.Package) PackageTopology {
	var t PackageTopology
	exchanges := map[string]string{} // name → kind
	for _, f := range p.Files {
		for _, m := range f.Messages {
			exchanges[m.Exchange] = m.ExchangeKind
		}
	}
	bind := func(queue string, m *model.Message) {
		exchanges[m.Exchange] = m.ExchangeKind
		t.Bindings = append(t.Bindings, Binding{Queue: queue, Exchange: m.Exchange, RoutingKey: m.RoutingKey})
	}
	declare := func(queue string, pol *retry.Policy) {
		if pol == nil {
			return
		}
		if t.Retry == nil {
			t.Retry = map[string]retry.Policy{}
		}
		t.Retry[queue] = *pol
	}
	for _, pt := range p.Participants {
		t.Queues = append(t.Queues, pt.Queue)
		declare(pt.Queue, pt.Retry)
		for _, c := range pt.Commands {
			bind(pt.Queue, c)
		}
	}
	for _, sb := range p.Subscribers {
		t.Queues = append(t.Queues, sb.Queue)
		declare(sb.Queue, sb.Retry)
		for _, e := range sb.Events {
			bind(sb.Queue, e)
		}
	}
	for _, f := range p.Files {
		for _, s := range f.Sagas {
			t.Queues = append(t.Queues, s.Queue)
			for _, m := range s.Consumes {
				bind(s.Queue, m)
			}
			// The exchanges the saga sends to: a process that runs only the
			// saga can publish before the participants' processes declared them.
			for _, m := range s.Commands {
				exchanges[m.Exchange] = m.ExchangeKind
			}
		}
	}
	for name, kind := range exchanges {
		t.Exchanges = append(t.Exchanges, broker.Exchange{Name: name, Kind: kind})
	}
	slices.SortFunc(t.Exchanges, func(a, b broker.Exchange) int { return cmp.Compare(a.Name, b.Name) })
	slices.Sort(t.Queues)
	t.Queues = slices.Compact(t.Queues)
	slices.SortFunc(t.Bindings, func(a, b Binding) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Exchange, b.Exchange), cmp.Compare(a.RoutingKey, b.RoutingKey))
	})
	t.Bindings = slices.Compact(t.Bindings)
	return t
}

// Broker returns t as the broker.Topology the generated Topology function
// builds (same queues, tiers and parking lots), so the definitions JSON for
// review is rendered by the runtime's own code and cannot drift from what
// broker.Declare declares.
func (t PackageTopology) Broker() broker.Topology {
	pl := broker.Plan{Exchanges: t.Exchanges, WorkQueues: t.Queues, Retry: t.Retry}
	for _, b := range t.Bindings {
		pl.Bindings = append(pl.Bindings, broker.Binding{Queue: b.Queue, Exchange: b.Exchange, RoutingKey: b.RoutingKey})
	}
	return pl.Default()
}

func genTopology(g *protogen.GeneratedFile, p *model.Package) {
	t := Topology(p)
	plan := model.TopologyPlanVar
	g.P("// ", model.TopologyFunc, " returns the RabbitMQ topology this package's contract needs:")
	g.P("// its exchanges (direct, or topic where an event is published), the work")
	g.P("// queues of its participants, subscribers and sagas (quorum")
	g.P("// queues, each with the retry tier queues of the policy its messages declare,")
	g.P("// else retry.Default(), and a parking lot, see broker.WorkQueue) and their")
	g.P("// bindings. Merge the topologies of every package a process uses and declare")
	g.P("// the result with broker.Declare. ", plan, ".Topology(qt, p) is the same with")
	g.P("// work queues of type qt and retry tiers for policy p where the contract")
	g.P("// declares none; the consumers of these queues must use the same policies.")
	g.P("func ", model.TopologyFunc, "() ", brokerPkg.Ident("Topology"), " { return ", plan, ".Default() }")
	g.P()
	g.P("// ", plan, " is this package's exchanges, work queues and bindings (see ", model.TopologyFunc, ").")
	g.P("var ", plan, " = ", brokerPkg.Ident("Plan"), "{")
	g.P("Exchanges: []", brokerPkg.Ident("Exchange"), "{")
	for _, e := range t.Exchanges {
		g.P("{Name: ", strconv.Quote(e.Name), ", Kind: ", strconv.Quote(e.Kind), "},")
	}
	g.P("},")
	if len(t.Queues) > 0 {
		g.P("WorkQueues: []string{")
		for _, q := range t.Queues {
			g.P(strconv.Quote(q), ",")
		}
		g.P("},")
	}
	if len(t.Bindings) > 0 {
		g.P("Bindings: []", brokerPkg.Ident("Binding"), "{")
		for _, b := range t.Bindings {
			g.P("{Queue: ", strconv.Quote(b.Queue), ", Exchange: ", strconv.Quote(b.Exchange), ", RoutingKey: ", strconv.Quote(b.RoutingKey), "},")
		}
		g.P("},")
	}
	if len(t.Retry) > 0 {
		g.P("Retry: map[string]", brokerPkg.Ident("RetryPolicy"), "{")
		for _, q := range slices.Sorted(maps.Keys(t.Retry)) {
			pol := t.Retry[q]
			var tiers []string
			for _, d := range pol.Tiers {
				tiers = append(tiers, goDuration(g, d))
			}
			g.P(strconv.Quote(q), ": {Tiers: []", timePkg.Ident("Duration"), "{", strings.Join(tiers, ", "), "}, MaxAttempts: ", pol.MaxAttempts, "},")
		}
		g.P("},")
	}
	g.P("}")
	g.P()
}
