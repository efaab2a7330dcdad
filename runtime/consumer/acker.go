package consumer

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// errAckerClosed is returned by acker.ack after the session closed its
// channel, or began to.
var errAckerClosed = errors.New("channel closed: delivery left for redelivery")

// acker acknowledges deliveries of one channel. It knows every delivery tag
// handed to a worker and not yet acknowledged, so it can acknowledge a batch
// with a single multiple-ack when no other outstanding tag lies below the
// batch's highest tag, and individually otherwise.
//
// Tags are registered by the one goroutine that reads the channel's
// deliveries, before any worker sees them, so a tag a worker holds can never
// be covered by another worker's multiple-ack. Once closed, the acker
// refuses every ack: nothing is acknowledged after (or while) the session
// closes its channel.
type acker struct {
	mu          sync.Mutex
	ch          acknowledger
	outstanding map[uint64]struct{}
	closed      bool
}

// acknowledger is the part of *amqp.Channel the acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

var _ acknowledger = (*amqp.Channel)(nil)

func newAcker(ch acknowledger) *acker {
	return &acker{ch: ch, outstanding: make(map[uint64]struct{})}
}

// add registers a delivered tag.
func (a *acker) add(tag uint64) {
	a.mu.Lock()
	a.outstanding[tag] = struct{}{}
	a.mu.Unlock()
}

// ack acknowledges tags, which must all have been registered.
func (a *acker) ack(tags []uint64) error {
	if len(tags) == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errAckerClosed
	}
	tags = slices.Clone(tags)
	slices.Sort(tags)
	highest := tags[len(tags)-1]
	below := 0
	for t := range a.outstanding {
		if t <= highest {
			below++
		}
	}
	for _, t := range tags {
		delete(a.outstanding, t)
	}
	if below == len(tags) && len(tags) > 1 {
		if err := a.ch.Ack(highest, true); err != nil {
			return fmt.Errorf("ack deliveries up to tag %d: %w", highest, err)
		}
		return nil
	}
	for _, t := range tags {
		if err := a.ch.Ack(t, false); err != nil {
			return fmt.Errorf("ack delivery tag %d: %w", t, err)
		}
	}
	return nil
}

// close makes every later ack fail; it waits for an ack in progress.
func (a *acker) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
}
