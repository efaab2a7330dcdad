package sagadef

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"slices"
	"strings"
)

// The SVG diagram draws the transition table (the arrows of [Definition.Mermaid]:
// rows between the same two states merged) on a grid of two lanes:
//
//   - the upper lane is the happy path, left to right: a start dot, then the
//     step states in layers by their distance from the start along forward
//     rows (a step state or COMPLETED reached from the start or a step state),
//     then COMPLETED;
//   - the lower lane holds the rest: each compensating state under its
//     step's state, so the compensation chain runs right to left back to
//     FAILED, which sits under the start dot; MANUAL_REVIEW and CANCELLED to
//     the right of the compensations, CANCELLED under COMPLETED.
//
// An arrow between two states of one lane with nothing between them is a
// straight line. Every other arrow leaves its state from the top or the
// bottom into one of three horizontal channels (above the upper lane,
// between the lanes, below the lower lane), runs along a track of its own
// and enters its target from the channel's side, so no arrow passes through
// a state. Tracks are packed so that no two arrows' horizontal runs, labels
// included, share a stretch of track: labels never sit on one another.
// Coordinates are whole numbers and every choice is made in a fixed order,
// so a definition always renders to the same bytes.

// SVGOptions says what [Definition.SVG] marks.
type SVGOptions struct {
	// Current is the state to highlight (an instance's state); "" for none.
	Current string
	// Visited are states an instance has been in; they are marked more
	// lightly than Current.
	Visited []string
}

// Diagram geometry, in pixels. Text is monospace so widths are known.
const (
	nameFont    = 12 // state names
	subFont     = 10 // the line under a state name
	labelFont   = 11 // arrow labels
	labelLineH  = 13
	boxH        = 40
	boxPadX     = 12
	minBoxW     = 110
	portGap     = 10 // minimum distance between two arrow ends on a side
	minColGap   = 48
	trackPad    = 8 // above a track's labels
	channelPad  = 14
	margin      = 16
	startR      = 7
	arrowLen    = 8
	arrowHalfW  = 4
	maxLabelLn  = 3  // label lines shown; the rest are counted
	maxLabelLen = 30 // runes per label line shown
)

// textWidth is the advance of s in a monospace font of the given size
// (0.6 em per character), rounded up.
func textWidth(s string, size int) int {
	return (len([]rune(s))*size*6 + 9) / 10
}

// Lanes and channels.
const (
	laneHappy = 0
	laneOther = 1

	chanTop    = 0 // above the happy lane
	chanMid    = 1 // between the lanes
	chanBottom = 2 // below the other lane
)

// Sides of a box.
const (
	sideTop = iota
	sideBottom
	sideLeft
	sideRight
)

// diagramNode is a state (or the start dot) on the grid.
type diagramNode struct {
	name     string // "" for the start dot
	state    State
	lane     int
	col      int
	x, y     int // top-left
	w, h     int
	subtitle string
}

func (n *diagramNode) cx() int { return n.x + n.w/2 }
func (n *diagramNode) cy() int { return n.y + n.h/2 }

// diagramEdge is one arrow with its route.
type diagramEdge struct {
	edge
	from, to *diagramNode
	class    string
	straight bool
	channel  int
	// ends: the x of the source and target ends on their sides (channel
	// routes), and the track's y.
	x1, x2 int
	track  int
	trackY int
	label  []string
	labelW int
	labelH int
	// lo, hi bound the stretch of track the arrow and its label occupy.
	lo, hi int
	labelX int // left of the label
	labelY int // top of the label
	points [][2]int
}

// SVG renders the transition table as a standalone SVG image (see the
// layout above), with a viewBox so it scales. Each state is a <g> with class
// "state", its kind and, per opts, "current" or "visited", and a
// data-state attribute; each arrow a <g> with class "edge" and data-from
// and data-to; a <title> in each lists the full triggers and emitted
// messages. All text is XML-escaped. It fails with [ErrNotCompiled] before
// Compile and with [ErrUnknownState] when opts names a state the definition
// does not have.
func (d *Definition) SVG(opts SVGOptions) ([]byte, error) {
	if d.compiled == nil {
		return nil, fmt.Errorf("saga %s: diagram: %w", d.Name, ErrNotCompiled)
	}
	known := func(name string) bool {
		return slices.ContainsFunc(d.States, func(s State) bool { return s.Name == name })
	}
	for _, name := range append([]string{opts.Current}, opts.Visited...) {
		if name != "" && !known(name) {
			return nil, fmt.Errorf("diagram: state %q is not a state of %s: %w", name, d.Name, ErrUnknownState)
		}
	}
	l := d.layout()
	return l.render(d, opts), nil
}

// diagramLayout is a placed diagram.
type diagramLayout struct {
	nodes  []*diagramNode // the start dot first, then d.States order
	byName map[string]*diagramNode
	edges  []*diagramEdge
	width  int
	height int
}

func (d *Definition) layout() *diagramLayout {
	l := &diagramLayout{byName: map[string]*diagramNode{}}
	start := &diagramNode{lane: laneHappy, w: 2 * startR, h: 2 * startR}
	l.nodes = append(l.nodes, start)
	l.byName[""] = start
	for _, s := range d.States {
		n := &diagramNode{name: s.Name, state: s, h: boxH, subtitle: d.subtitle(s)}
		l.nodes = append(l.nodes, n)
		l.byName[s.Name] = n
	}
	l.placeOnGrid(d)
	for _, e := range d.edges() {
		from, to := l.byName[e.from], l.byName[e.to]
		if from == nil || to == nil {
			continue // a row naming a state not in States: nothing to draw it on
		}
		de := &diagramEdge{edge: e, from: from, to: to, class: edgeClass(e, from, to)}
		de.label = labelLines(e.triggers)
		for _, ln := range de.label {
			de.labelW = max(de.labelW, textWidth(ln, labelFont))
		}
		de.labelH = len(de.label) * labelLineH
		l.edges = append(l.edges, de)
	}
	l.route()
	return l
}

// subtitle is the small line under a state's name.
func (d *Definition) subtitle(s State) string {
	switch s.Kind {
	case StateKindStep:
		if st, ok := d.LookupStep(s.Step); ok {
			if st.External {
				return st.Role.String() + ", external"
			}
			return st.Role.String()
		}
	case StateKindCompensating:
		return "compensation"
	case StateKindManualReview:
		return "waits for an operator"
	case StateKindTerminal:
		return "terminal"
	}
	return s.Kind.String()
}

// placeOnGrid assigns lanes and columns.
func (l *diagramLayout) placeOnGrid(d *Definition) {
	// Layers: distance from the start along forward rows.
	forwardTarget := func(s State) bool { return s.Kind == StateKindStep || s.Name == StateCompleted }
	layer := map[string]int{"": 0}
	queue := []string{""}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != "" && l.byName[cur].state.Kind != StateKindStep {
			continue
		}
		for _, t := range d.Transitions {
			to := l.byName[t.To]
			if t.From != cur || to == nil || !forwardTarget(to.state) {
				continue
			}
			if _, seen := layer[t.To]; !seen {
				layer[t.To] = layer[cur] + 1
				queue = append(queue, t.To)
			}
		}
	}
	// The happy lane: steps by layer (unreached ones last, in States
	// order), then COMPLETED.
	var happy []*diagramNode
	for _, n := range l.nodes[1:] {
		if n.state.Kind == StateKindStep {
			happy = append(happy, n)
		}
	}
	rank := func(n *diagramNode) int {
		if v, ok := layer[n.name]; ok {
			return v
		}
		return len(l.nodes)
	}
	slices.SortStableFunc(happy, func(a, b *diagramNode) int { return cmp.Compare(rank(a), rank(b)) })
	if c := l.byName[StateCompleted]; c != nil {
		happy = append(happy, c)
	}
	last := 0
	for i, n := range happy {
		n.lane, n.col = laneHappy, i+1
		last = i + 1
	}
	// The other lane.
	taken := map[int]bool{}
	put := func(n *diagramNode, col int) {
		for taken[col] {
			col++
		}
		n.lane, n.col = laneOther, col
		taken[col] = true
		last = max(last, col)
	}
	placed := func(n *diagramNode) bool { return n.lane == laneOther || (n.lane == laneHappy && n.col > 0) }
	if f := l.byName[StateFailed]; f != nil {
		put(f, 0)
	}
	maxComp := 0
	for _, n := range l.nodes[1:] {
		if n.state.Kind != StateKindCompensating {
			continue
		}
		col := last + 1
		if st := l.byName[StateName(n.state.Step)]; st != nil && st.lane == laneHappy && st.col > 0 {
			col = st.col
		}
		put(n, col)
		maxComp = max(maxComp, n.col)
	}
	end := l.byName[StateCompleted]
	endCol := last
	if end != nil {
		endCol = end.col
	}
	var free []int
	for c := maxComp + 1; c <= endCol; c++ {
		if !taken[c] {
			free = append(free, c)
		}
	}
	review, cancelled := l.byName[StateManualReview], l.byName[StateCancelled]
	switch {
	case review != nil && len(free) >= 2:
		put(review, free[(len(free)-2)/2])
	case review != nil:
		put(review, endCol+1)
	}
	if cancelled != nil {
		if len(free) >= 1 && !taken[free[len(free)-1]] {
			put(cancelled, free[len(free)-1])
		} else {
			put(cancelled, last+1)
		}
	}
	for _, n := range l.nodes[1:] {
		if !placed(n) {
			put(n, last+1)
		}
	}
}

// edgeClass classifies an arrow for its style: a retry (a state to
// itself), one into manual review, an operator's (only operator
// triggers), one into compensation (a compensating state or FAILED), or a
// forward one.
func edgeClass(e edge, from, to *diagramNode) string {
	switch {
	case from == to:
		return "retry"
	case to.state.Kind == StateKindManualReview:
		return "review"
	case !slices.ContainsFunc(e.triggers, func(t string) bool { return !strings.HasPrefix(t, "operator.") }):
		return "operator"
	case to.state.Kind == StateKindCompensating || to.name == StateFailed:
		return "compensate"
	default:
		return "forward"
	}
}

// labelLines is an arrow's visible label: its triggers, one a line, at most
// maxLabelLn lines (the last says how many more there are), each cut to
// maxLabelLen runes. The <title> has them all.
func labelLines(triggers []string) []string {
	cut := func(s string) string {
		if r := []rune(s); len(r) > maxLabelLen {
			return string(r[:maxLabelLen-1]) + "…"
		}
		return s
	}
	var out []string
	for i, t := range triggers {
		if i == maxLabelLn-1 && len(triggers) > maxLabelLn {
			out = append(out, fmt.Sprintf("+%d more", len(triggers)-i))
			break
		}
		out = append(out, cut(t))
	}
	return out
}

// route sizes the boxes, picks each arrow's route, packs the channels'
// tracks and places everything.
func (l *diagramLayout) route() {
	// Straight arrows: same lane, different states, no state between them,
	// and no other straight arrow along the same stretch. First come, first
	// served, in table order (the happy path's rows come first).
	type span struct{ lane, lo, hi int }
	var straight []span
	between := func(lane, lo, hi int) bool {
		for _, n := range l.nodes {
			if n.lane == lane && n.col > lo && n.col < hi {
				return true
			}
		}
		return false
	}
	for _, e := range l.edges {
		if e.from == e.to || e.from.lane != e.to.lane {
			continue
		}
		lo, hi := min(e.from.col, e.to.col), max(e.from.col, e.to.col)
		if between(e.from.lane, lo, hi) || slices.ContainsFunc(straight, func(s span) bool {
			return s.lane == e.from.lane && s.lo < hi && lo < s.hi
		}) {
			continue
		}
		e.straight = true
		straight = append(straight, span{e.from.lane, lo, hi})
	}
	// Channels and the sides the arrows use.
	type end struct {
		e     *diagramEdge
		src   bool
		other *diagramNode
	}
	sides := map[*diagramNode]map[int][]end{}
	addEnd := func(n *diagramNode, side int, x end) {
		if sides[n] == nil {
			sides[n] = map[int][]end{}
		}
		sides[n][side] = append(sides[n][side], x)
	}
	sideOf := func(n *diagramNode, ch int) int {
		if (ch == chanTop) || (ch == chanMid && n.lane == laneOther) {
			return sideTop
		}
		return sideBottom
	}
	for _, e := range l.edges {
		if e.straight {
			continue
		}
		switch {
		case e.from.lane != e.to.lane:
			e.channel = chanMid
		case e.from.lane == laneHappy:
			e.channel = chanTop
		default:
			e.channel = chanBottom
		}
		addEnd(e.from, sideOf(e.from, e.channel), end{e, true, e.to})
		addEnd(e.to, sideOf(e.to, e.channel), end{e, false, e.from})
	}
	// Box widths: the text, and room for the arrows' ends.
	for _, n := range l.nodes[1:] {
		n.w = max(minBoxW, textWidth(n.name, nameFont)+2*boxPadX, textWidth(n.subtitle, subFont)+2*boxPadX)
		for _, ends := range sides[n] {
			n.w = max(n.w, (len(ends)+1)*portGap)
		}
	}
	// Columns: widths, then gaps wide enough for the straight arrows'
	// labels.
	cols := 0
	for _, n := range l.nodes {
		cols = max(cols, n.col+1)
	}
	colW := make([]int, cols)
	for _, n := range l.nodes {
		colW[n.col] = max(colW[n.col], n.w)
	}
	gap := make([]int, cols) // gap[c] is between column c and c+1
	for c := range gap {
		gap[c] = minColGap
	}
	for _, e := range l.edges {
		if !e.straight {
			continue
		}
		lo, hi := min(e.from.col, e.to.col), max(e.from.col, e.to.col)
		avail := 0
		for c := lo; c < hi; c++ {
			avail += gap[c]
			if c > lo {
				avail += colW[c]
			}
		}
		if need := e.labelW + 2*arrowLen + 8; need > avail {
			gap[lo] += need - avail
		}
	}
	colX := make([]int, cols)
	x := margin
	for c := range cols {
		colX[c] = x
		x += colW[c] + gap[c]
	}
	l.width = x - gap[cols-1] + margin
	for _, n := range l.nodes {
		n.x = colX[n.col] + (colW[n.col]-n.w)/2
	}
	// Arrow ends along each side, ordered by where the other end is so
	// that arrows cross as little as possible; a loop's two ends sit side
	// by side.
	for _, n := range l.nodes {
		for _, side := range []int{sideTop, sideBottom} {
			ends := sides[n][side]
			slices.SortStableFunc(ends, func(a, b end) int {
				return cmp.Or(cmp.Compare(a.other.col, b.other.col), cmp.Compare(a.other.lane, b.other.lane))
			})
			for i, en := range ends {
				px := n.x + (i+1)*n.w/(len(ends)+1)
				if en.src {
					en.e.x1 = px
				} else {
					en.e.x2 = px
				}
			}
		}
	}
	// Tracks: pack each channel's arrows so that no two share a stretch
	// of track (label included).
	chHeight := [3]int{}
	for ch := chanTop; ch <= chanBottom; ch++ {
		var es []*diagramEdge
		for _, e := range l.edges {
			if !e.straight && e.channel == ch {
				lo, hi := min(e.x1, e.x2), max(e.x1, e.x2)
				if w := e.labelW + 8; hi-lo < w {
					lo = max((lo+hi)/2-w/2, 2)
					hi = lo + w
				}
				l.width = max(l.width, hi+margin)
				e.lo, e.hi = lo, hi
				es = append(es, e)
			}
		}
		slices.SortStableFunc(es, func(a, b *diagramEdge) int { return cmp.Compare(a.lo, b.lo) })
		var trackEnd, trackH []int
		for _, e := range es {
			t := slices.IndexFunc(trackEnd, func(hi int) bool { return hi+portGap < e.lo })
			if t < 0 {
				t = len(trackEnd)
				trackEnd, trackH = append(trackEnd, 0), append(trackH, 0)
			}
			e.track = t
			trackEnd[t] = e.hi
			trackH[t] = max(trackH[t], e.labelH+trackPad)
		}
		// Offsets of the track lines from the channel's lane-side edge:
		// track 0 nearest the happy lane (top, mid) or the other lane
		// (bottom). A track's labels sit above its line, within its height.
		h := channelPad
		offs := make([]int, len(trackH))
		for t, th := range trackH {
			if ch == chanTop {
				offs[t] = h
				h += th
			} else {
				h += th
				offs[t] = h
			}
		}
		h += channelPad
		chHeight[ch] = h
		for _, e := range es {
			e.trackY = offs[e.track] // from the channel's lane-side edge
		}
	}
	// Room for straight labels, which sit above their line and may rise
	// above the boxes into the channel over their lane.
	rise := [2]int{}
	for _, e := range l.edges {
		if e.straight {
			rise[e.from.lane] = max(rise[e.from.lane], e.labelH+4-boxH/2)
		}
	}
	topH := chHeight[chanTop] + max(rise[laneHappy], 0)
	midH := chHeight[chanMid] + max(rise[laneOther], 0)
	laneY := [2]int{margin + topH, margin + topH + boxH + midH}
	l.height = laneY[laneOther] + boxH + chHeight[chanBottom] + margin + legendH
	for _, n := range l.nodes {
		n.y = laneY[n.lane] + (boxH-n.h)/2
	}
	// Track y: top channel counts up from the happy lane's top, the
	// middle one down from its bottom, the bottom one down from the other
	// lane's bottom.
	for _, e := range l.edges {
		if e.straight {
			continue
		}
		switch e.channel {
		case chanTop:
			e.trackY = laneY[laneHappy] - max(rise[laneHappy], 0) - e.trackY
		case chanMid:
			e.trackY = laneY[laneHappy] + boxH + e.trackY
		case chanBottom:
			e.trackY = laneY[laneOther] + boxH + e.trackY
		}
	}
	for _, e := range l.edges {
		l.place(e)
	}
	l.width = max(l.width, legendWidth()+2*margin)
}

// place computes an arrow's points and its label's position.
func (l *diagramLayout) place(e *diagramEdge) {
	if e.straight {
		a, b := e.from, e.to
		y := a.cy()
		x1, x2 := a.x+a.w, b.x
		if b.col < a.col {
			x1, x2 = a.x, b.x+b.w
		}
		e.points = [][2]int{{x1, y}, {x2, y}}
		e.labelX = (x1+x2)/2 - e.labelW/2
		e.labelY = y - 4 - e.labelH
		return
	}
	y1 := l.sideY(e.from, e.trackY)
	y2 := l.sideY(e.to, e.trackY)
	e.points = [][2]int{{e.x1, y1}, {e.x1, e.trackY}, {e.x2, e.trackY}, {e.x2, y2}}
	// The label rests on the track, where the fewest other arrows' ends
	// cross it, as near the middle of its stretch as that allows.
	e.labelY = e.trackY - 2 - e.labelH
	best, bestCost := 0, -1
	center := (e.lo+e.hi)/2 - e.labelW/2
	for x := e.lo; x+e.labelW <= e.hi; x += 2 {
		crossings := 0
		for _, o := range l.edges {
			if o == e || o.straight || o.channel != e.channel {
				continue
			}
			for _, p := range [][2]int{{o.x1, l.sideY(o.from, o.trackY)}, {o.x2, l.sideY(o.to, o.trackY)}} {
				ylo, yhi := min(p[1], o.trackY), max(p[1], o.trackY)
				if p[0] >= x-2 && p[0] <= x+e.labelW+2 && ylo < e.trackY && yhi > e.labelY {
					crossings++
				}
			}
		}
		cost := crossings*10000 + abs(x-center)
		if bestCost < 0 || cost < bestCost {
			best, bestCost = x, cost
		}
	}
	e.labelX = best
}

// sideY is the y where an arrow running on a track at trackY meets n: its
// top when the track is above it, else its bottom.
func (l *diagramLayout) sideY(n *diagramNode, trackY int) int {
	if trackY < n.y {
		return n.y
	}
	return n.y + n.h
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

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
func stateStyle(s State) (fill, stroke string) {
	switch {
	case s.Kind == StateKindStep:
		return "#ffffff", "#5d6677"
	case s.Kind == StateKindCompensating:
		return "#fff4e5", "#a35a00"
	case s.Kind == StateKindManualReview:
		return "#fdecea", "#b3261e"
	case s.Name == StateCompleted:
		return "#e6f4ea", "#1c7c3a"
	case s.Name == StateFailed:
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

func (l *diagramLayout) render(d *Definition, opts SVGOptions) []byte {
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
	return from + " → " + e.to.name + "\n" + strings.Join(e.lines, "\n")
}

func (l *diagramLayout) renderNode(w *svgWriter, n *diagramNode, opts SVGOptions) {
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
	case StateKindManualReview:
		// An octagon: the one state that waits for a human.
		c := 8
		w.open("polygon", true, "points", pointsAttr([][2]int{
			{x + c, y}, {x + wd - c, y}, {x + wd, y + c}, {x + wd, y + h - c},
			{x + wd - c, y + h}, {x + c, y + h}, {x, y + h - c}, {x, y + c},
		}), "class", "box", "fill", fill, "stroke", stroke, "stroke-width", "2")
	case StateKindTerminal:
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
