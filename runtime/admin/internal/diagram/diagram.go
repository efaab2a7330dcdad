// Package diagram draws a saga definition's transition table as an SVG
// image for the admin console (GET /api/types/{type}/diagram.svg), with an
// instance's state and path marked.
package diagram

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/protosaga/saga/runtime/sagadef"
)

// The SVG diagram draws the transition table (the arrows of [sagadef.Definition.Mermaid]:
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

// Options says what [SVG] marks.
type Options struct {
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
	state    sagadef.State
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
	sagadef.Edge
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
// messages. All text is XML-escaped. It fails with [sagadef.ErrNotCompiled] before
// Compile and with [sagadef.ErrUnknownState] when opts names a state the definition
// does not have.
func SVG(d *sagadef.Definition, opts Options) ([]byte, error) {
	if !d.Compiled() {
		return nil, fmt.Errorf("saga %s: diagram: %w", d.Name, sagadef.ErrNotCompiled)
	}
	known := func(name string) bool {
		return slices.ContainsFunc(d.States, func(s sagadef.State) bool { return s.Name == name })
	}
	for _, name := range append([]string{opts.Current}, opts.Visited...) {
		if name != "" && !known(name) {
			return nil, fmt.Errorf("diagram: state %q is not a state of %s: %w", name, d.Name, sagadef.ErrUnknownState)
		}
	}
	l := layout(d)
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

func layout(d *sagadef.Definition) *diagramLayout {
	l := &diagramLayout{byName: map[string]*diagramNode{}}
	start := &diagramNode{lane: laneHappy, w: 2 * startR, h: 2 * startR}
	l.nodes = append(l.nodes, start)
	l.byName[""] = start
	for _, s := range d.States {
		n := &diagramNode{name: s.Name, state: s, h: boxH, subtitle: subtitle(d, s)}
		l.nodes = append(l.nodes, n)
		l.byName[s.Name] = n
	}
	l.placeOnGrid(d)
	for _, e := range d.Edges() {
		from, to := l.byName[e.From], l.byName[e.To]
		if from == nil || to == nil {
			continue // a row naming a state not in States: nothing to draw it on
		}
		de := &diagramEdge{Edge: e, from: from, to: to, class: edgeClass(e, from, to)}
		de.label = labelLines(e.Triggers)
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
func subtitle(d *sagadef.Definition, s sagadef.State) string {
	switch s.Kind {
	case sagadef.StateKindStep:
		if st, ok := d.LookupStep(s.Step); ok {
			sub := st.Role.String()
			if st.External {
				sub += ", external"
			}
			if st.Conditional {
				sub += ", conditional"
			}
			return sub
		}
	case sagadef.StateKindGroup:
		return "parallel: " + strings.Join(d.Members(s.Group), ", ")
	case sagadef.StateKindCompensating:
		return "compensation"
	case sagadef.StateKindManualReview:
		return "waits for an operator"
	case sagadef.StateKindTerminal:
		return "terminal"
	}
	return s.Kind.String()
}

// placeOnGrid assigns lanes and columns.
func (l *diagramLayout) placeOnGrid(d *sagadef.Definition) {
	// Layers: distance from the start along forward rows.
	forwardTarget := func(s sagadef.State) bool {
		return s.Kind == sagadef.StateKindStep || s.Kind == sagadef.StateKindGroup || s.Name == sagadef.StateCompleted
	}
	layer := map[string]int{"": 0}
	queue := []string{""}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if k := l.byName[cur]; cur != "" && k.state.Kind != sagadef.StateKindStep && k.state.Kind != sagadef.StateKindGroup {
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
		if n.state.Kind == sagadef.StateKindStep || n.state.Kind == sagadef.StateKindGroup {
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
	if c := l.byName[sagadef.StateCompleted]; c != nil {
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
	if f := l.byName[sagadef.StateFailed]; f != nil {
		put(f, 0)
	}
	maxComp := 0
	for _, n := range l.nodes[1:] {
		if n.state.Kind != sagadef.StateKindCompensating {
			continue
		}
		col := last + 1
		if st := l.byName[sagadef.StateName(n.state.Step)]; st != nil && st.lane == laneHappy && st.col > 0 {
			col = st.col
		}
		put(n, col)
		maxComp = max(maxComp, n.col)
	}
	end := l.byName[sagadef.StateCompleted]
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
	review, cancelled := l.byName[sagadef.StateManualReview], l.byName[sagadef.StateCancelled]
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
func edgeClass(e sagadef.Edge, from, to *diagramNode) string {
	switch {
	case from == to:
		return "retry"
	case to.state.Kind == sagadef.StateKindManualReview:
		return "review"
	case !slices.ContainsFunc(e.Triggers, func(t string) bool { return !strings.HasPrefix(t, "operator.") }):
		return "operator"
	case to.state.Kind == sagadef.StateKindCompensating || to.name == sagadef.StateFailed:
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
