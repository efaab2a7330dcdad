package golang

import (
	"cmp"
	"slices"
	"strconv"

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
	for _, pt := range p.Participants {
		t.Queues = append(t.Queues, pt.Queue)
		for _, c := range pt.Commands {
			bind(pt.Queue, c)
		}
	}
	for _, sb := range p.Subscribers {
		t.Queues = append(t.Queues, sb.Queue)
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
	bt := broker.Topology{Exchanges: slices.Clone(t.Exchanges)}
	for _, q := range t.Queues {
		bt.Queues = append(bt.Queues, broker.WorkQueue(q, broker.QueueQuorum, retry.Default())...)
	}
	for _, b := range t.Bindings {
		bt.Bindings = append(bt.Bindings, broker.Binding{Queue: b.Queue, Exchange: b.Exchange, RoutingKey: b.RoutingKey})
	}
	return bt
}

func genTopology(g *protogen.GeneratedFile, p *model.Package) {
	t := Topology(p)
	plan := model.TopologyPlanVar
	g.P("// ", model.TopologyFunc, " returns the RabbitMQ topology this package's contract needs:")
	g.P("// its exchanges (direct, or topic where an event is published), the work")
	g.P("// queues of its participants, subscribers and sagas (quorum")
	g.P("// queues, each with the retry tier queues of retry.Default() and a parking")
	g.P("// lot, see broker.WorkQueue) and their bindings. Merge the topologies of every")
	g.P("// package a process uses and declare the result with broker.Declare.")
	g.P("// ", plan, ".Topology(qt, p) is the same with work queues of type qt and")
	g.P("// retry tiers for policy p; the consumers of these queues must use the same policy.")
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
	g.P("}")
	g.P()
}
