package text

import (
	"github.com/protosaga/saga/runtime/sagadef"
)

// Gateways of the BPMN export: a parallel group's fork and join, and the
// exclusive split and merge around a conditional step.

const (
	bpmnGateway = 50 // gateway width and height
	// bpmnBypassY is the center y of the rows the bypassing flows take
	// between the compensation handlers and the steps: a gateway's flows
	// to and from members that are not next to it, and a skipped
	// conditional step's flow.
	bpmnBypassY    = bpmnMainY - bpmnTaskH/2 - 16
	bpmnBypassStep = 12
)

// bpmnSlot kinds.
const (
	slotStep  = "step"
	slotFork  = "fork"
	slotJoin  = "join"
	slotSplit = "split"
	slotMerge = "merge"
)

// bpmnSlotOf is one column of the happy path: a step or a gateway.
type bpmnSlotOf struct {
	kind  string
	step  int    // the step (for a gateway: the conditional step, or the group's first member)
	group string // the group of a fork or join
}

// bpmnLayout is the happy path's columns.
type bpmnLayout struct {
	slots []bpmnSlotOf
	step  []int // step index → its column
}

// bpmnColumns lays the steps out in columns, with a column for each
// gateway.
func bpmnColumns(steps []sagadef.Step) bpmnLayout {
	l := bpmnLayout{step: make([]int, len(steps))}
	for i, st := range steps {
		if st.Group != "" && (i == 0 || steps[i-1].Group != st.Group) {
			l.slots = append(l.slots, bpmnSlotOf{kind: slotFork, step: i, group: st.Group})
		}
		if st.Conditional {
			l.slots = append(l.slots, bpmnSlotOf{kind: slotSplit, step: i})
		}
		l.step[i] = len(l.slots)
		l.slots = append(l.slots, bpmnSlotOf{kind: slotStep, step: i})
		if st.Conditional {
			l.slots = append(l.slots, bpmnSlotOf{kind: slotMerge, step: i})
		}
		if st.Group != "" && (i+1 == len(steps) || steps[i+1].Group != st.Group) {
			l.slots = append(l.slots, bpmnSlotOf{kind: slotJoin, step: i, group: st.Group})
		}
	}
	return l
}

// happyPath adds the steps and gateways in their columns, and the flows
// between them, from prev (whose right edge is at prevRight); it returns
// the last node and its right edge.
func (b *bpmnBuilder) happyPath(def *sagadef.Definition, l bpmnLayout, owners map[string]string, cx func(int) int,
	taskW int, prev string, prevRight int) (string, int) {
	steps := def.Steps
	top := bpmnMainY - bpmnTaskH/2
	gTop := bpmnMainY - bpmnGateway/2
	var fork, split string
	var forkX, splitX int
	var members []int // the current group's members but the last
	fanOut := 0       // the fork's flows over the top so far
	for c, sl := range l.slots {
		x := cx(c)
		switch sl.kind {
		case slotFork:
			g := b.node("Fork_"+sl.group, "parallelGateway", "")
			g.Doc = "Parallel group " + sl.group + ": every member's command is sent in one transaction; " +
				"a member's failure or timeout, or the group's, stops the others and compensates."
			b.shape(g, x, bpmnMainY, bpmnGateway, bpmnGateway)
			b.flow(prev, g.ID, "", [2]int{prevRight, bpmnMainY}, [2]int{x - bpmnGateway/2, bpmnMainY})
			fork, forkX, members, fanOut = g.ID, x, nil, 0
			prev, prevRight = g.ID, x+bpmnGateway/2
		case slotJoin:
			g := b.node("Join_"+sl.group, "parallelGateway", "")
			g.Doc = "Joins group " + sl.group + ": the saga moves on when every member succeeded."
			b.shape(g, x, bpmnMainY, bpmnGateway, bpmnGateway)
			// The last member flows straight in; the others over the top.
			b.flow(prev, g.ID, "", [2]int{prevRight, bpmnMainY}, [2]int{x - bpmnGateway/2, bpmnMainY})
			for k, m := range members {
				mx := cx(l.step[m])
				y := bpmnBypassY - bpmnBypassStep*(2*k+1)
				jx := x + 6*k
				b.flow(stepID(steps[m]), g.ID, "", [2]int{mx + taskW/4, top}, [2]int{mx + taskW/4, y}, [2]int{jx, y}, [2]int{jx, gTop})
			}
			prev, prevRight = g.ID, x+bpmnGateway/2
		case slotSplit:
			g := b.node("Split_"+steps[sl.step].Name, "exclusiveGateway", "")
			g.Doc = "The decider decides from the saga data whether step " + steps[sl.step].Name + " runs."
			b.shape(g, x, bpmnMainY, bpmnGateway, bpmnGateway)
			b.flow(prev, g.ID, "", [2]int{prevRight, bpmnMainY}, [2]int{x - bpmnGateway/2, bpmnMainY})
			split, splitX = g.ID, x
			prev, prevRight = g.ID, x+bpmnGateway/2
		case slotMerge:
			g := b.node("Merge_"+steps[sl.step].Name, "exclusiveGateway", "")
			b.shape(g, x, bpmnMainY, bpmnGateway, bpmnGateway)
			b.flow(prev, g.ID, "", [2]int{prevRight, bpmnMainY}, [2]int{x - bpmnGateway/2, bpmnMainY})
			b.flow(split, g.ID, "skipped", [2]int{splitX, gTop}, [2]int{splitX, bpmnBypassY}, [2]int{x, bpmnBypassY}, [2]int{x, gTop})
			prev, prevRight = g.ID, x+bpmnGateway/2
		default:
			st := steps[sl.step]
			task := b.stepTask(st, owners, def)
			b.shape(task, x, bpmnMainY, taskW, bpmnTaskH)
			if st.Group != "" {
				first := sl.step == 0 || steps[sl.step-1].Group != st.Group
				last := sl.step+1 == len(steps) || steps[sl.step+1].Group != st.Group
				if first {
					b.flow(fork, task.ID, "", [2]int{forkX + bpmnGateway/2, bpmnMainY}, [2]int{x - taskW/2, bpmnMainY})
				} else {
					// From the fork over the top.
					y := bpmnBypassY - bpmnBypassStep*(2*fanOut+2)
					fx := forkX - 6*fanOut
					fanOut++
					b.flow(fork, task.ID, "", [2]int{fx, gTop}, [2]int{fx, y}, [2]int{x - taskW/4, y}, [2]int{x - taskW/4, top})
				}
				if last {
					prev, prevRight = task.ID, x+taskW/2 // straight into the join
				} else {
					members = append(members, sl.step) // into the join over the top
				}
				continue
			}
			b.flow(prev, task.ID, "", [2]int{prevRight, bpmnMainY}, [2]int{x - taskW/2, bpmnMainY})
			prev, prevRight = task.ID, x+taskW/2
		}
	}
	return prev, prevRight
}
