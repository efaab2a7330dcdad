package diagram_test

import (
	"bytes"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	quotev1 "github.com/protosaga/saga/examples/quoteapproval/quote/v1"
	"github.com/protosaga/saga/runtime/admin/internal/diagram"
	"github.com/protosaga/saga/runtime/sagadef"
	activationv1 "github.com/protosaga/saga/testdata/golden/shapes/activation/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// svgNode is an element of a parsed SVG document.
type svgNode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Nodes   []svgNode  `xml:",any"`
	Text    string     `xml:",chardata"`
}

func (n svgNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n svgNode) hasClass(c string) bool { return slices.Contains(strings.Fields(n.attr("class")), c) }

// find returns the elements under n (n included) for which match holds.
func (n svgNode) find(match func(svgNode) bool) []svgNode {
	var out []svgNode
	if match(n) {
		out = append(out, n)
	}
	for _, c := range n.Nodes {
		out = append(out, c.find(match)...)
	}
	return out
}

func (n svgNode) child(tag string) svgNode {
	for _, c := range n.Nodes {
		if c.XMLName.Local == tag {
			return c
		}
	}
	return svgNode{}
}

// parseSVG parses b strictly as XML.
func parseSVG(t *testing.T, b []byte) svgNode {
	t.Helper()
	var root svgNode
	dec := xml.NewDecoder(bytes.NewReader(b))
	dec.Strict = true
	require.NoError(t, dec.Decode(&root), "the SVG is well-formed XML")
	require.Equal(t, "svg", root.XMLName.Local)
	require.Equal(t, "http://www.w3.org/2000/svg", root.XMLName.Space)
	return root
}

// rect is an axis-aligned box.
type rect struct{ x0, y0, x1, y1 float64 }

func (r rect) overlaps(o rect) bool { return r.x0 < o.x1 && o.x0 < r.x1 && r.y0 < o.y1 && o.y0 < r.y1 }

func num(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err, "number %q", s)
	return v
}

func points(t *testing.T, s string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(s) {
		x, y, ok := strings.Cut(p, ",")
		require.True(t, ok, "point %q", p)
		out = append(out, [2]float64{num(t, x), num(t, y)})
	}
	return out
}

// bounds is the bounding box of a rect or polygon.
func bounds(t *testing.T, n svgNode) rect {
	t.Helper()
	if n.XMLName.Local == "rect" {
		x, y := num(t, n.attr("x")), num(t, n.attr("y"))
		return rect{x, y, x + num(t, n.attr("width")), y + num(t, n.attr("height"))}
	}
	pts := points(t, n.attr("points"))
	r := rect{pts[0][0], pts[0][1], pts[0][0], pts[0][1]}
	for _, p := range pts {
		r = rect{min(r.x0, p[0]), min(r.y0, p[1]), max(r.x1, p[0]), max(r.y1, p[1])}
	}
	return r
}

// drawing is what a test reads back from a rendered SVG.
type drawing struct {
	root   svgNode
	boxes  map[string]rect    // state name → its box
	states map[string]svgNode // state name → its <g>
	edges  map[[2]string][]svgNode
	labels []rect
}

func readDiagram(t *testing.T, b []byte) drawing {
	t.Helper()
	d := drawing{root: parseSVG(t, b), boxes: map[string]rect{}, states: map[string]svgNode{}, edges: map[[2]string][]svgNode{}}
	for _, g := range d.root.find(func(n svgNode) bool { return n.XMLName.Local == "g" && n.hasClass("state") }) {
		name := g.attr("data-state")
		_, dup := d.states[name]
		require.False(t, dup, "state %s drawn twice", name)
		d.states[name] = g
		shapes := g.find(func(n svgNode) bool { return n.hasClass("box") })
		require.Len(t, shapes, 1, "state %s has one box", name)
		d.boxes[name] = bounds(t, shapes[0])
	}
	for _, g := range d.root.find(func(n svgNode) bool { return n.XMLName.Local == "g" && n.hasClass("edge") }) {
		k := [2]string{g.attr("data-from"), g.attr("data-to")}
		d.edges[k] = append(d.edges[k], g)
	}
	for _, bg := range d.root.find(func(n svgNode) bool { return n.hasClass("label-bg") }) {
		d.labels = append(d.labels, bounds(t, bg))
	}
	return d
}

// examples are the definitions of the example applications and a variant,
// compiled.
func examples(t *testing.T) map[string]*sagadef.Definition {
	t.Helper()
	out := map[string]*sagadef.Definition{
		"examples/placeorder":    orderv1.PlaceOrderDefinition(),
		"examples/quoteapproval": quotev1.QuoteApprovalDefinition(),
		"testdata/golden/shapes": activationv1.ActivationDefinition(),
		"variant no deadline, late review": placeOrder(func(d *sagadef.Definition) { d.Deadline = 0 },
			late("ScheduleShipping", sagadef.LateManualReview)),
	}
	for _, d := range out {
		if len(d.Transitions) > 0 { // generated: the printed table must be the computed one
			require.NoError(t, d.CompileGenerated())
		} else {
			require.NoError(t, d.Compile())
		}
	}
	return out
}

// TestSVGDrawsEveryTransition: every row of the table is drawn, on the one
// arrow of its (from, to) pair, whose title lists the row's trigger; every
// state is drawn once; no two boxes overlap, no arrow passes through a
// box it does not start or end at, and no label sits on another label or
// on a box.
func TestSVGDrawsEveryTransition(t *testing.T) {
	t.Parallel()
	for name, def := range examples(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := diagram.SVG(def, diagram.Options{})
			require.NoError(t, err)
			d := readDiagram(t, b)
			require.Regexp(t, `^0 0 \d+ \d+$`, d.root.attr("viewBox"))

			require.Len(t, d.states, len(def.States))
			for _, s := range def.States {
				require.Contains(t, d.states, s.Name)
			}
			pairs := map[[2]string]bool{}
			for _, tr := range def.Transitions {
				k := [2]string{tr.From, tr.To}
				pairs[k] = true
				require.Len(t, d.edges[k], 1, "one arrow %s → %s", tr.From, tr.To)
				title := d.edges[k][0].child("title").Text
				trig := tr.Trigger[strings.LastIndexByte(tr.Trigger, '.')+1:]
				if strings.HasPrefix(tr.Trigger, "operator.") {
					trig = tr.Trigger
				}
				require.Contains(t, strings.Split(title, "\n"), trig+emitsSuffix(tr), "arrow %s → %s lists row %v", tr.From, tr.To, tr)
			}
			require.Len(t, d.edges, len(pairs), "no arrow without a row")

			names := slices.Sorted(func(yield func(string) bool) {
				for n := range d.boxes {
					if !yield(n) {
						return
					}
				}
			})
			for i, a := range names {
				for _, b := range names[i+1:] {
					require.False(t, d.boxes[a].overlaps(d.boxes[b]), "boxes %s and %s overlap", a, b)
				}
			}
			for k, gs := range d.edges {
				pts := points(t, gs[0].child("polyline").attr("points"))
				for _, n := range names {
					if n == k[0] || n == k[1] {
						continue
					}
					in := d.boxes[n]
					in = rect{in.x0 + 1, in.y0 + 1, in.x1 - 1, in.y1 - 1}
					for i := range len(pts) - 1 {
						seg := rect{min(pts[i][0], pts[i+1][0]), min(pts[i][1], pts[i+1][1]), max(pts[i][0], pts[i+1][0]), max(pts[i][1], pts[i+1][1])}
						seg.x1, seg.y1 = seg.x1+0.01, seg.y1+0.01
						require.False(t, seg.overlaps(in), "arrow %s → %s passes through %s", k[0], k[1], n)
					}
				}
			}
			for i, a := range d.labels {
				for _, b := range d.labels[i+1:] {
					require.False(t, a.overlaps(b), "labels %v and %v overlap", a, b)
				}
				for _, n := range names {
					require.False(t, a.overlaps(d.boxes[n]), "label %v sits on %s", a, n)
				}
			}
		})
	}
}

func emitsSuffix(tr sagadef.Transition) string {
	if len(tr.Emits) == 0 {
		return ""
	}
	short := make([]string, len(tr.Emits))
	for i, m := range tr.Emits {
		short[i] = m[strings.LastIndexByte(m, '.')+1:]
	}
	return " / " + strings.Join(short, ", ")
}

// TestSVGLayout: the happy path reads left to right on one lane, each
// compensating state sits below and the compensation chain runs back to
// FAILED, and the kinds of states look different.
func TestSVGLayout(t *testing.T) {
	t.Parallel()
	d := readDiagram(t, placeOrderExampleSVG(t))
	happy := []string{"RESERVE_INVENTORY", "AUTHORIZE_PAYMENT", "SCHEDULE_SHIPPING", "APPROVE_ORDER", "COMPLETED"}
	for i := 1; i < len(happy); i++ {
		a, b := d.boxes[happy[i-1]], d.boxes[happy[i]]
		require.Equal(t, a.y0, b.y0, "%s and %s on one lane", happy[i-1], happy[i])
		require.Less(t, a.x1, b.x0, "%s left of %s", happy[i-1], happy[i])
	}
	comp, failed := d.boxes["COMPENSATING_RESERVE_INVENTORY"], d.boxes["FAILED"]
	require.Greater(t, comp.y0, d.boxes["RESERVE_INVENTORY"].y1, "compensation below the happy path")
	require.Less(t, comp.x0, d.boxes["RESERVE_INVENTORY"].x1, "under its step")
	require.Less(t, failed.x1, comp.x0, "the chain runs back to FAILED")
	for _, s := range []string{"MANUAL_REVIEW", "CANCELLED"} {
		require.Greater(t, d.boxes[s].y0, d.boxes["APPROVE_ORDER"].y1, "%s off the happy path", s)
	}
	shape := func(s string) string {
		return d.states[s].find(func(n svgNode) bool { return n.hasClass("box") })[0].XMLName.Local
	}
	require.Equal(t, "polygon", shape("MANUAL_REVIEW"), "manual review is an octagon")
	for _, s := range []string{"COMPLETED", "FAILED", "CANCELLED"} {
		require.True(t, d.states[s].hasClass("terminal"))
		require.Len(t, d.states[s].find(func(n svgNode) bool { return n.XMLName.Local == "rect" }), 2, "%s has a double border", s)
	}
	require.True(t, d.edges[[2]string{"RESERVE_INVENTORY", "AUTHORIZE_PAYMENT"}][0].hasClass("forward"))
	require.True(t, d.edges[[2]string{"AUTHORIZE_PAYMENT", "COMPENSATING_RESERVE_INVENTORY"}][0].hasClass("compensate"))
	require.True(t, d.edges[[2]string{"AUTHORIZE_PAYMENT", "MANUAL_REVIEW"}][0].hasClass("review"))
	require.True(t, d.edges[[2]string{"MANUAL_REVIEW", "CANCELLED"}][0].hasClass("operator"))
	require.True(t, d.edges[[2]string{"AUTHORIZE_PAYMENT", "AUTHORIZE_PAYMENT"}][0].hasClass("retry"))

	// More steps, a wider picture.
	wider := placeOrder(func(d *sagadef.Definition) {
		extra := d.Steps[3]
		extra.Name, extra.Command, extra.SuccessReplies = "NotifyCustomer", "shop.v1.NotifyCustomer", []string{"shop.v1.CustomerNotified"}
		d.Steps = append(d.Steps, extra)
	})
	require.NoError(t, wider.Compile())
	small, err := diagram.SVG(placeOrder(), diagram.Options{})
	require.ErrorIs(t, err, sagadef.ErrNotCompiled)
	require.Nil(t, small)
	small, err = diagram.SVG(compiled(t, placeOrder()), diagram.Options{})
	require.NoError(t, err)
	big, err := diagram.SVG(wider, diagram.Options{})
	require.NoError(t, err)
	width := func(b []byte) float64 { return num(t, parseSVG(t, b).attr("width")) }
	require.Greater(t, width(big), width(small))
}

// TestSVGHighlight: Current and Visited mark their states (current wins);
// a name that is not a state is an error.
func TestSVGHighlight(t *testing.T) {
	t.Parallel()
	def := compiled(t, placeOrder())
	b, err := diagram.SVG(def, diagram.Options{Current: "AUTHORIZE_PAYMENT", Visited: []string{"RESERVE_INVENTORY", "AUTHORIZE_PAYMENT"}})
	require.NoError(t, err)
	d := readDiagram(t, b)
	for name, g := range d.states {
		require.Equal(t, name == "AUTHORIZE_PAYMENT", g.hasClass("current"), name)
		require.Equal(t, name == "RESERVE_INVENTORY", g.hasClass("visited"), name)
		require.Equal(t, g.hasClass("current") || g.hasClass("visited"),
			len(g.find(func(n svgNode) bool { return n.hasClass("highlight") })) == 1, "%s is drawn marked", name)
	}
	plain, err := diagram.SVG(def, diagram.Options{})
	require.NoError(t, err)
	require.NotContains(t, string(plain), "highlight")

	_, err = diagram.SVG(def, diagram.Options{Current: "NOPE"})
	require.ErrorIs(t, err, sagadef.ErrUnknownState)
	_, err = diagram.SVG(def, diagram.Options{Visited: []string{"COMPLETED", "nope"}})
	require.ErrorIs(t, err, sagadef.ErrUnknownState)
}

// TestSVGDeterministic: the same definition renders to the same bytes,
// compiled once or again.
func TestSVGDeterministic(t *testing.T) {
	t.Parallel()
	for name, def := range examples(t) {
		a, err := diagram.SVG(def, diagram.Options{Current: sagadef.StateManualReview})
		require.NoError(t, err)
		for range 20 {
			again := *def
			require.NoError(t, again.Compile())
			b, err := diagram.SVG(&again, diagram.Options{Current: sagadef.StateManualReview})
			require.NoError(t, err)
			require.Equal(t, string(a), string(b), name)
		}
	}
}

// TestSVGEscapes: state and message names are text, never markup, even
// when a table carries hostile ones.
func TestSVGEscapes(t *testing.T) {
	t.Parallel()
	const evilState = `X"><script>alert(1)</script><x a='`
	const evilTrigger = `evil.v1.<img src=x onerror=f()>&amp;`
	def := compiled(t, placeOrder())
	def.States[0].Name = evilState
	reserved := def.Steps[0].SuccessReplies[0] // InventoryReserved
	for i, tr := range def.Transitions {
		if tr.From == "RESERVE_INVENTORY" {
			def.Transitions[i].From = evilState
		}
		if tr.To == "RESERVE_INVENTORY" {
			def.Transitions[i].To = evilState
		}
		if tr.Trigger == reserved {
			def.Transitions[i].Trigger = evilTrigger
		}
	}
	b, err := diagram.SVG(def, diagram.Options{Current: evilState})
	require.NoError(t, err)
	require.NotContains(t, string(b), "<script")
	require.NotContains(t, string(b), "<img")
	require.NotContains(t, string(b), "<x ")
	d := readDiagram(t, b)
	require.Empty(t, d.root.find(func(n svgNode) bool {
		return !slices.Contains([]string{"svg", "title", "g", "rect", "polygon", "polyline", "circle", "line", "text"}, n.XMLName.Local)
	}), "only the diagram's own elements")
	require.Contains(t, d.states, evilState)
	require.True(t, d.states[evilState].hasClass("current"))
	var texts []string
	for _, n := range d.root.find(func(n svgNode) bool { return n.XMLName.Local == "text" }) {
		texts = append(texts, n.Text)
	}
	require.Contains(t, texts, evilState)
	require.Contains(t, texts, `<img src=x onerror=f()>&amp;`, "the trigger's short name, as text")
}

// TestSVGShapes: the subtitle under a step's name says its role, and
// whether it is external and conditional.
func TestSVGShapes(t *testing.T) {
	t.Parallel()
	b, err := diagram.SVG(examples(t)["testdata/golden/shapes"], diagram.Options{})
	require.NoError(t, err)
	d := readDiagram(t, b)
	sub := func(state string) []string {
		var out []string
		for _, n := range d.states[state].find(func(n svgNode) bool { return n.XMLName.Local == "text" }) {
			out = append(out, n.Text)
		}
		return out
	}
	require.Contains(t, sub("VALIDATE_ADDRESS"), "check")
	require.Contains(t, sub("CREDIT_CHECK"), "check, external, conditional")
	require.Contains(t, sub("SEND_WELCOME_PACK"), "retriable, conditional")
	require.Contains(t, sub("PREPARE"), "parallel: ReserveNumber, ShipSim", "a group's state names its members")
	_, member := d.states["RESERVE_NUMBER"]
	require.False(t, member, "a group's members have no state of their own")
}

// TestSVGGolden compares the Place Order example's diagram with the
// committed one (testdata/place_order.svg); run with -update to rewrite it
// after an intended change, and look at it.
func TestSVGGolden(t *testing.T) {
	t.Parallel()
	got := placeOrderExampleSVG(t)
	path := filepath.Join("testdata", "place_order.svg")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./runtime/admin/internal/diagram -run TestSVGGolden -update")
	require.Equal(t, string(want), string(got), "golden %s differs; rerun with -update if intended", path)
}

// placeOrderExampleSVG is the Place Order example's diagram, unmarked.
func placeOrderExampleSVG(t *testing.T) []byte {
	t.Helper()
	def := orderv1.PlaceOrderDefinition()
	require.NoError(t, def.CompileGenerated())
	b, err := diagram.SVG(def, diagram.Options{})
	require.NoError(t, err)
	return b
}

// placeOrder returns the Place Order example's definition without its
// printed transition table, so that mods can change it before Compile.
func placeOrder(mods ...func(*sagadef.Definition)) *sagadef.Definition {
	d := orderv1.PlaceOrderDefinition()
	d.Transitions = nil
	for _, m := range mods {
		m(d)
	}
	return d
}

// compiled compiles d, failing the test on error.
func compiled(t testing.TB, d *sagadef.Definition) *sagadef.Definition {
	t.Helper()
	require.NoError(t, d.Compile())
	return d
}

// late sets the late policy of the named step.
func late(step string, p sagadef.LatePolicy) func(*sagadef.Definition) {
	return func(d *sagadef.Definition) {
		for i := range d.Steps {
			if d.Steps[i].Name == step {
				d.Steps[i].Late = p
			}
		}
	}
}
