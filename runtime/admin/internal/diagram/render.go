package diagram

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"slices"
	"strings"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Legend.
const legendH = 28

var legend = []struct{ class, text string }{
	{"forward", "forward"},
	{"compensate", "to compensation"},
	{"review", "to manual review"},
	{"operator", "operator action"},
	{"retry", "resend (same state)"},
}

func legendWidth() int {
	w := 0
	for _, it := range legend {
		w += 28 + textWidth(it.text, labelFont) + 18
	}
	return w
}

// edgeStyle is the stroke of each class of arrow.
var edgeStyle = map[string]struct{ color, dash, width string }{
	"forward":    {"#1d2330", "", "1.6"},
	"compensate": {"#a35a00", "6 3", "1.4"},
	"review":     {"#b3261e", "2 3", "1.2"},
	"operator":   {"#6a3fb5", "8 3 2 3", "1.2"},
	"retry":      {"#5d6677", "", "1.2"},
}

// stateStyle is the fill and stroke of each kind of state.
func stateStyle(s sagadef.State) (fill, stroke string) {
	switch {
	case s.Kind == sagadef.StateKindStep:
		return "#ffffff", "#5d6677"
	case s.Kind == sagadef.StateKindGroup:
		return "#eef4ff", "#2f5fb3"
	case s.Kind == sagadef.StateKindCompensating:
		return "#fff4e5", "#a35a00"
	case s.Kind == sagadef.StateKindManualReview:
		return "#fdecea", "#b3261e"
	case s.Name == sagadef.StateCompleted:
		return "#e6f4ea", "#1c7c3a"
	case s.Name == sagadef.StateFailed:
		return "#fdecea", "#b3261e"
	default:
		return "#eceff3", "#5d6677"
	}
}

// svgWriter writes SVG elements with escaped attributes and text.
type svgWriter struct{ b bytes.Buffer }

// open writes <tag a="v" ...> (or <tag .../> when selfClose); attrs are
// name, value pairs; empty values are left out.
func (w *svgWriter) open(tag string, selfClose bool, attrs ...string) {
	w.b.WriteString("<" + tag)
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i+1] == "" {
			continue
		}
		w.b.WriteString(" " + attrs[i] + `="`)
		_ = xml.EscapeText(&w.b, []byte(attrs[i+1])) // bytes.Buffer writes do not fail
		w.b.WriteString(`"`)
	}
	if selfClose {
		w.b.WriteString("/>\n")
	} else {
		w.b.WriteString(">")
	}
}

// text writes <tag attrs>escaped text</tag>.
func (w *svgWriter) text(tag, text string, attrs ...string) {
	w.open(tag, false, attrs...)
	_ = xml.EscapeText(&w.b, []byte(text))
	w.b.WriteString("</" + tag + ">\n")
}

func (w *svgWriter) close(tag string) { w.b.WriteString("</" + tag + ">\n") }

func itoa(v int) string { return fmt.Sprint(v) }

func pointsAttr(pts [][2]int) string {
	var s []string
	for _, p := range pts {
		s = append(s, itoa(p[0])+","+itoa(p[1]))
	}
	return strings.Join(s, " ")
}

// arrowHead is the triangle at the end of a segment from a to b.
func arrowHead(a, b [2]int) string {
	dx, dy := sign(b[0]-a[0]), sign(b[1]-a[1])
	base := [2]int{b[0] - dx*arrowLen, b[1] - dy*arrowLen}
	l := [2]int{base[0] - dy*arrowHalfW, base[1] + dx*arrowHalfW}
	r := [2]int{base[0] + dy*arrowHalfW, base[1] - dx*arrowHalfW}
	return pointsAttr([][2]int{b, l, r})
}

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

func (l *diagramLayout) render(d *sagadef.Definition, opts Options) []byte {
	w := &svgWriter{}
	size := func(v int) string { return itoa(v) }
	w.open("svg", false, "xmlns", "http://www.w3.org/2000/svg",
		"viewBox", "0 0 "+size(l.width)+" "+size(l.height), "width", size(l.width), "height", size(l.height),
		"class", "saga-diagram", "role", "img", "aria-label", "State diagram of "+d.Name,
		"font-family", "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace")
	w.b.WriteString("\n")
	w.text("title", "State diagram of "+d.Name)
	w.open("rect", true, "x", "0", "y", "0", "width", size(l.width), "height", size(l.height), "fill", "#ffffff")
	// Arrows, then their labels over them, then the states.
	for _, e := range l.edges {
		st := edgeStyle[e.class]
		w.open("g", false, "class", "edge "+e.class, "data-from", e.from.name, "data-to", e.to.name)
		w.text("title", edgeTitle(e))
		w.open("polyline", true, "points", pointsAttr(e.points), "fill", "none",
			"stroke", st.color, "stroke-width", st.width, "stroke-dasharray", st.dash)
		n := len(e.points)
		w.open("polygon", true, "points", arrowHead(e.points[n-2], e.points[n-1]), "fill", st.color)
		w.close("g")
	}
	for _, e := range l.edges {
		w.open("g", false, "class", "label", "data-from", e.from.name, "data-to", e.to.name)
		w.text("title", edgeTitle(e))
		w.open("rect", true, "class", "label-bg", "x", itoa(e.labelX-2), "y", itoa(e.labelY), "width", itoa(e.labelW+4), "height", itoa(e.labelH+1),
			"fill", "#ffffff", "fill-opacity", "0.85")
		for i, ln := range e.label {
			w.text("text", ln, "x", itoa(e.labelX), "y", itoa(e.labelY+(i+1)*labelLineH-3),
				"font-size", itoa(labelFont), "fill", edgeStyle[e.class].color)
		}
		w.close("g")
	}
	for _, n := range l.nodes {
		l.renderNode(w, n, opts)
	}
	l.renderLegend(w)
	w.close("svg")
	return w.b.Bytes()
}

func edgeTitle(e *diagramEdge) string {
	from := e.from.name
	if from == "" {
		from = "(start)"
	}
	return from + " → " + e.to.name + "\n" + strings.Join(e.Lines, "\n")
}

func (l *diagramLayout) renderNode(w *svgWriter, n *diagramNode, opts Options) {
	if n.name == "" {
		w.open("circle", true, "class", "start", "cx", itoa(n.cx()), "cy", itoa(n.cy()), "r", itoa(startR), "fill", "#1d2330")
		return
	}
	class := "state " + strings.ReplaceAll(n.state.Kind.String(), " ", "-")
	switch {
	case n.name == opts.Current:
		class += " current"
	case slices.Contains(opts.Visited, n.name):
		class += " visited"
	}
	fill, stroke := stateStyle(n.state)
	w.open("g", false, "class", class, "data-state", n.name)
	title := n.name + " (" + n.state.Kind.String() + ")"
	if n.state.Step != "" {
		title += ", step " + n.state.Step
	}
	w.text("title", title)
	x, y, wd, h := n.x, n.y, n.w, n.h
	switch {
	case n.name == opts.Current:
		w.open("rect", true, "class", "highlight", "x", itoa(x-5), "y", itoa(y-5), "width", itoa(wd+10), "height", itoa(h+10),
			"rx", "9", "fill", "#dce6fb", "stroke", "#2456c9", "stroke-width", "3")
	case slices.Contains(opts.Visited, n.name):
		w.open("rect", true, "class", "highlight", "x", itoa(x-4), "y", itoa(y-4), "width", itoa(wd+8), "height", itoa(h+8),
			"rx", "8", "fill", "#eef3ff", "stroke", "#9db5ea", "stroke-width", "1.5", "stroke-dasharray", "4 2")
	}
	switch n.state.Kind {
	case sagadef.StateKindManualReview:
		// An octagon: the one state that waits for a human.
		c := 8
		w.open("polygon", true, "points", pointsAttr([][2]int{
			{x + c, y}, {x + wd - c, y}, {x + wd, y + c}, {x + wd, y + h - c},
			{x + wd - c, y + h}, {x + c, y + h}, {x, y + h - c}, {x, y + c},
		}), "class", "box", "fill", fill, "stroke", stroke, "stroke-width", "2")
	case sagadef.StateKindTerminal:
		// A double border, like a final state.
		w.open("rect", true, "class", "box", "x", itoa(x), "y", itoa(y), "width", itoa(wd), "height", itoa(h), "rx", "12",
			"fill", fill, "stroke", stroke, "stroke-width", "1.5")
		w.open("rect", true, "x", itoa(x+3), "y", itoa(y+3), "width", itoa(wd-6), "height", itoa(h-6), "rx", "9",
			"fill", "none", "stroke", stroke, "stroke-width", "1")
	default:
		w.open("rect", true, "class", "box", "x", itoa(x), "y", itoa(y), "width", itoa(wd), "height", itoa(h), "rx", "4",
			"fill", fill, "stroke", stroke, "stroke-width", "1.2")
	}
	weight := ""
	if n.name == opts.Current {
		weight = "bold"
	}
	w.text("text", n.name, "x", itoa(n.cx()), "y", itoa(y+17), "text-anchor", "middle", "font-size", itoa(nameFont),
		"font-weight", weight, "fill", "#1d2330")
	w.text("text", n.subtitle, "x", itoa(n.cx()), "y", itoa(y+31), "text-anchor", "middle", "font-size", itoa(subFont),
		"fill", "#5d6677")
	w.close("g")
}

func (l *diagramLayout) renderLegend(w *svgWriter) {
	y := l.height - margin - legendH/2
	x := margin
	w.open("g", false, "class", "legend")
	for _, it := range legend {
		st := edgeStyle[it.class]
		w.open("line", true, "x1", itoa(x), "y1", itoa(y), "x2", itoa(x+22), "y2", itoa(y),
			"stroke", st.color, "stroke-width", st.width, "stroke-dasharray", st.dash)
		w.text("text", it.text, "x", itoa(x+28), "y", itoa(y+4), "font-size", itoa(labelFont), "fill", "#5d6677")
		x += 28 + textWidth(it.text, labelFont) + 18
	}
	w.close("g")
}
