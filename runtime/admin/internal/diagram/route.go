package diagram

import (
	"cmp"
	"slices"
)

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
