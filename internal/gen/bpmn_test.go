package gen_test

import (
	"context"
	"encoding/xml"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen/regen"
)

// xmlNode is a generic XML element.
type xmlNode struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Children []xmlNode  `xml:",any"`
	Text     string     `xml:",chardata"`
}

func (n xmlNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n xmlNode) walk(f func(xmlNode, []xmlNode)) { n.walkIn(nil, f) }

func (n xmlNode) walkIn(parents []xmlNode, f func(xmlNode, []xmlNode)) {
	f(n, parents)
	for _, c := range n.Children {
		c.walkIn(append(slices.Clone(parents), n), f)
	}
}

func (n xmlNode) child(local string) (xmlNode, bool) {
	for _, c := range n.Children {
		if c.XMLName.Local == local {
			return c, true
		}
	}
	return xmlNode{}, false
}

type box struct{ x, y, w, h float64 }

func (b box) overlaps(o box) bool {
	return b.x < o.x+o.w && o.x < b.x+b.w && b.y < o.y+o.h && o.y < b.y+b.h
}

// onEdge reports whether point p lies on the outline of b (within 1 unit).
func (b box) onEdge(px, py float64) bool {
	within := func(v, lo, hi float64) bool { return v >= lo-1 && v <= hi+1 }
	near := func(v, at float64) bool { return v >= at-1 && v <= at+1 }
	return (within(px, b.x, b.x+b.w) && (near(py, b.y) || near(py, b.y+b.h))) ||
		(within(py, b.y, b.y+b.h) && (near(px, b.x) || near(px, b.x+b.w)))
}

func bounds(t *testing.T, n xmlNode) box {
	t.Helper()
	f := func(k string) float64 {
		v, err := strconv.ParseFloat(n.attr(k), 64)
		require.NoError(t, err, "bounds %s", k)
		return v
	}
	return box{f("x"), f("y"), f("width"), f("height")}
}

// bpmnModel is what the checks read from one generated file.
type bpmnModel struct {
	elements map[string]xmlNode // process elements by id
	parent   map[string]string  // element id → its sub-process, "" at the top
	shapes   map[string]box     // element id → shape bounds
	labels   map[string]box     // element id → label bounds, when given
	edges    map[string][][2]float64
	kinds    map[string][]string // element name → ids, in document order
}

func readBPMN(t *testing.T, name string, content []byte) *bpmnModel {
	t.Helper()
	var root xmlNode
	require.NoError(t, xml.Unmarshal(content, &root), "%s is not XML", name)
	require.Equal(t, "definitions", root.XMLName.Local)
	m := &bpmnModel{elements: map[string]xmlNode{}, parent: map[string]string{}, shapes: map[string]box{},
		labels: map[string]box{}, edges: map[string][][2]float64{}, kinds: map[string][]string{}}
	const model, di = "http://www.omg.org/spec/BPMN/20100524/MODEL", "http://www.omg.org/spec/BPMN/20100524/DI"
	root.walk(func(n xmlNode, parents []xmlNode) {
		id := n.attr("id")
		switch {
		case n.XMLName.Space == model && id != "" && len(parents) >= 2 && parents[1].XMLName.Local == "process":
			require.NotContains(t, m.elements, id, "%s: id %s twice", name, id)
			m.elements[id] = n
			m.kinds[n.XMLName.Local] = append(m.kinds[n.XMLName.Local], id)
			if p := parents[len(parents)-1]; p.XMLName.Local == "subProcess" {
				m.parent[id] = p.attr("id")
			}
		case n.XMLName.Space == di && n.XMLName.Local == "BPMNShape":
			el := n.attr("bpmnElement")
			require.NotContains(t, m.shapes, el, "%s: %s drawn twice", name, el)
			b, ok := n.child("Bounds")
			require.True(t, ok, "%s: shape of %s without bounds", name, el)
			m.shapes[el] = bounds(t, b)
			if l, ok := n.child("BPMNLabel"); ok {
				lb, ok := l.child("Bounds")
				require.True(t, ok)
				m.labels[el] = bounds(t, lb)
			}
		case n.XMLName.Space == di && n.XMLName.Local == "BPMNEdge":
			el := n.attr("bpmnElement")
			for _, w := range n.Children {
				x, err := strconv.ParseFloat(w.attr("x"), 64)
				require.NoError(t, err)
				y, err := strconv.ParseFloat(w.attr("y"), 64)
				require.NoError(t, err)
				m.edges[el] = append(m.edges[el], [2]float64{x, y})
			}
		}
	})
	return m
}

func (m *bpmnModel) ids(kind string) []string { return m.kinds[kind] }

// generatedBPMN returns every .bpmn file the generator writes for the
// repository's targets, by path.
func generatedBPMN(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, target := range regen.Targets() {
		files, err := regen.Generate(context.Background(), repoRoot, target)
		require.NoError(t, err)
		for name, content := range files {
			if strings.HasSuffix(name, ".bpmn") {
				out[name] = content
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// TestBPMNLayout checks every generated BPMN file's diagram: every flow
// node, sequence flow and association is drawn once; every flow starts on
// its source's outline and ends on its target's; no two shapes overlap but
// a boundary event and its task, and a sub-process and its content; no label
// the generator places overlaps a shape or another label.
func TestBPMNLayout(t *testing.T) {
	t.Parallel()
	for name, content := range generatedBPMN(t) {
		t.Run(name, func(t *testing.T) {
			m := readBPMN(t, name, content)
			for id, n := range m.elements {
				switch n.XMLName.Local {
				case "sequenceFlow", "association":
					pts := m.edges[id]
					require.GreaterOrEqual(t, len(pts), 2, "%s is not drawn", id)
					src, dst := n.attr("sourceRef"), n.attr("targetRef")
					first, last := pts[0], pts[len(pts)-1]
					require.True(t, m.shapes[src].onEdge(first[0], first[1]), "%s starts at %v, off %s %v", id, first, src, m.shapes[src])
					require.True(t, m.shapes[dst].onEdge(last[0], last[1]), "%s ends at %v, off %s %v", id, last, dst, m.shapes[dst])
					for i := 1; i < len(pts); i++ {
						require.True(t, pts[i][0] == pts[i-1][0] || pts[i][1] == pts[i-1][1], "%s: segment %d is not straight", id, i)
					}
				case "documentation", "text", "incoming", "outgoing", "timeDuration":
				default:
					if !strings.HasSuffix(n.XMLName.Local, "EventDefinition") {
						require.Contains(t, m.shapes, id, "%s (%s) is not drawn", id, n.XMLName.Local)
					}
				}
			}
			host := func(id string) string { return m.elements[id].attr("attachedToRef") }
			ids := slices.Sorted(maps.Keys(m.shapes))
			for i, a := range ids {
				for _, b := range ids[i+1:] {
					related := host(a) == b || host(b) == a || m.parent[a] == b || m.parent[b] == a
					if !related {
						require.False(t, m.shapes[a].overlaps(m.shapes[b]), "%s %v overlaps %s %v", a, m.shapes[a], b, m.shapes[b])
					}
				}
				if l, ok := m.labels[a]; ok {
					for _, b := range ids {
						if b != a && b != host(a) {
							require.False(t, l.overlaps(m.shapes[b]), "the label of %s %v overlaps %s %v", a, l, b, m.shapes[b])
						}
						if lb, ok := m.labels[b]; ok && b != a {
							require.False(t, l.overlaps(lb), "the label of %s overlaps the label of %s", a, b)
						}
					}
				}
			}
		})
	}
}

// TestBPMNPlaceOrder checks what the Place Order saga's process says: a
// service task per step, the reservation's compensation handler, business
// failures as error boundary events, timers with the steps' timeouts, the
// pivot annotated, and the deadline as an event sub-process.
func TestBPMNPlaceOrder(t *testing.T) {
	t.Parallel()
	content := generatedBPMN(t)["examples/placeorder/shop/order/v1/place_order.saga.bpmn"]
	require.NotNil(t, content)
	m := readBPMN(t, "place_order", content)
	name := func(id string) string { return m.elements[id].attr("name") }
	var tasks []string
	for _, id := range m.ids("serviceTask") {
		if m.elements[id].attr("isForCompensation") != "true" {
			tasks = append(tasks, name(id))
		}
	}
	require.Equal(t, []string{"Reserve Inventory", "Authorize Payment", "Schedule Shipping", "Approve Order"}, tasks)

	undo := m.elements["Undo_ReserveInventory"]
	require.Equal(t, "true", undo.attr("isForCompensation"))
	require.Equal(t, "Release Inventory", undo.attr("name"))
	assoc := m.elements["Association_ReserveInventory"]
	require.Equal(t, "Compensation_ReserveInventory", assoc.attr("sourceRef"))
	require.Equal(t, "Undo_ReserveInventory", assoc.attr("targetRef"))
	_, ok := m.elements["Compensation_ReserveInventory"].child("compensateEventDefinition")
	require.True(t, ok)
	require.Len(t, m.ids("association"), 2, "the handler's and the pivot annotation's")

	timers := map[string]string{}
	errs := map[string]string{}
	for _, id := range m.ids("boundaryEvent") {
		ev := m.elements[id]
		if d, ok := ev.child("timerEventDefinition"); ok {
			dur, ok := d.child("timeDuration")
			require.True(t, ok)
			timers[ev.attr("attachedToRef")] = dur.Text
		}
		if d, ok := ev.child("errorEventDefinition"); ok {
			errs[ev.attr("attachedToRef")] = d.attr("errorRef")
		}
	}
	require.Equal(t, map[string]string{"Step_ReserveInventory": "PT30S", "Step_AuthorizePayment": "PT1M",
		"Step_ScheduleShipping": "PT1M", "Step_ApproveOrder": "PT30S"}, timers)
	require.Equal(t, map[string]string{"Step_ReserveInventory": "Error_shop_inventory_v1_InventoryReservationFailed",
		"Step_AuthorizePayment": "Error_shop_payment_v1_PaymentAuthorizationFailed"}, errs, "no business failure after the pivot")

	throw := m.elements["CompensateFailed"]
	_, ok = throw.child("compensateEventDefinition")
	require.True(t, ok)
	var into []string
	for _, id := range m.ids("sequenceFlow") {
		if m.elements[id].attr("targetRef") == "CompensateFailed" {
			into = append(into, m.elements[id].attr("sourceRef"))
		}
	}
	require.ElementsMatch(t, []string{"Timeout_ReserveInventory", "Failure_ReserveInventory", "Failure_AuthorizePayment"}, into)

	require.Equal(t, []string{"Pivot_AuthorizePayment"}, m.ids("textAnnotation"))
	require.Equal(t, "Step_AuthorizePayment", m.elements["Association_Pivot_AuthorizePayment"].attr("sourceRef"))

	sub := m.elements["Deadline"]
	require.Equal(t, "true", sub.attr("triggeredByEvent"))
	start, ok := sub.child("startEvent")
	require.True(t, ok)
	def, ok := start.child("timerEventDefinition")
	require.True(t, ok)
	dur, _ := def.child("timeDuration")
	require.Equal(t, "PT1H", dur.Text)
	require.Equal(t, "false", findAttr(t, content, "process", "isExecutable"), "documentation, not a process to run")
}

// TestBPMNQuoteApproval: an external step is a receive task whose rejection
// is a message boundary event, and the business cancel interrupts only the
// steps before the point of no return.
func TestBPMNQuoteApproval(t *testing.T) {
	t.Parallel()
	content := generatedBPMN(t)["examples/quoteapproval/quote/v1/quote_approval.saga.bpmn"]
	require.NotNil(t, content)
	m := readBPMN(t, "quote_approval", content)
	require.Equal(t, []string{"Step_Approval"}, m.ids("receiveTask"))
	require.Equal(t, "Message_approval_v1_ApprovalGranted", m.elements["Step_Approval"].attr("messageRef"))
	rejected := m.elements["Failure_Approval_ApprovalRejected"]
	d, ok := rejected.child("messageEventDefinition")
	require.True(t, ok)
	require.Equal(t, "Message_approval_v1_ApprovalRejected", d.attr("messageRef"))
	var cancels []string
	for _, id := range m.ids("boundaryEvent") {
		if strings.HasPrefix(id, "Cancel_") {
			cancels = append(cancels, m.elements[id].attr("attachedToRef"))
		}
	}
	require.Equal(t, []string{"Step_PriceQuote", "Step_Approval"}, cancels)
	require.Contains(t, m.elements, "EndCancelled")
}

func findAttr(t *testing.T, content []byte, local, attr string) string {
	t.Helper()
	var root xmlNode
	require.NoError(t, xml.Unmarshal(content, &root))
	var v string
	root.walk(func(n xmlNode, _ []xmlNode) {
		if n.XMLName.Local == local && v == "" {
			v = n.attr(attr)
		}
	})
	return v
}

// committedBPMN lists the .bpmn files in the repository (examples and
// testdata), relative to its root.
func committedBPMN(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"examples", "testdata"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".bpmn") {
				rel, err := filepath.Rel(repoRoot, p)
				if err != nil {
					return err
				}
				out = append(out, filepath.ToSlash(rel))
			}
			return nil
		}))
	}
	slices.Sort(out)
	require.Equal(t, slices.Sorted(maps.Keys(generatedBPMN(t))), out, "every generated .bpmn is committed, and only those")
	return out
}
