package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/trace"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/retry"
)

// pipeline is the state the stages of one Run share.
type pipeline struct {
	r     *Relay
	ctx   context.Context // Run's
	stop  context.Context // ends claiming and sending
	halt  context.CancelFunc
	grace context.Context // parent of every batch's work context
	abort context.CancelFunc

	lockTried <-chan struct{} // closed once the listener first tried for the liveness lock

	crashed  chan struct{} // closed when the afterPublish hook fails
	crashErr error         // set before crashed is closed
}

// crash stops the relay as a dead process would: nothing more is sent,
// marked or released.
func (p *pipeline) crash(err error) {
	p.crashErr = err
	close(p.crashed)
	p.halt()
	p.abort()
}

func (p *pipeline) hasCrashed() bool {
	select {
	case <-p.crashed:
		return true
	default:
		return false
	}
}

type row struct {
	id       int64
	attempts int32
	env      message.Envelope
	// pendingSince is when the row became pending again after it was
	// published (an operator's replay: saga_outbox_pending.pending_since);
	// invalid for every other row. The claim compares it with the outbox
	// row's created_at, both the database's clock, and reports it only when
	// later, so the publish delay of other rows uses one clock.
	pendingSince pgtype.Timestamptz
}

// batch is one claim on its way through the pipeline.
type batch struct {
	rows      []row
	claimedAt time.Time // by the relay's clock, for logs
	deadline  time.Time // when the lease runs out: claimed + LeaseDuration, or what a hand-off's insert left
	// work bounds publishing and settling the batch: the lease, and the
	// drain once Run's context ends. finish releases it.
	work   context.Context
	finish context.CancelFunc

	handed  bool // handed over by a consumer's commit (see relayOf), not claimed
	sent    bool // published (false: released unpublished)
	spans   []trace.Span
	pending *broker.Pending
	errs    []error // per row, once its confirm was awaited
}

// claimer claims batches into out until p.stop ends, then closes out.
func (p *pipeline) claimer(wake <-chan struct{}, out chan<- *batch) {
	defer close(out)
	r := p.r
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	// The first claim waits (a little) for the listener's first try at the
	// liveness lock: rows claimed before the lock is held wait for their
	// lease, not for the other relays' liveness check, if the process dies.
	if p.lockTried != nil {
		select {
		case <-p.lockTried:
		case <-time.After(max(r.cfg.PollInterval, time.Second)):
		case <-p.stop.Done():
			return
		}
	}
	var reaped time.Time
	wasBlocked := false
	for failures := 0; p.stop.Err() == nil; {
		if time.Since(reaped) >= r.cfg.PollInterval {
			// Rows of relays that died wait for no lease (liveness.go).
			reaped = time.Now()
			if err := r.reap(p.stop); err != nil && p.stop.Err() == nil {
				r.cfg.Logger.Warn("outbox relay: could not look for relays that are gone", "owner", r.cfg.Owner, "error", err)
			}
		}
		// While the broker blocks the connection (a resource alarm),
		// nothing can be published: rows stay unclaimed rather than being
		// claimed, failed and released over and over.
		if reason, blocked := r.cfg.Conn.Blocked(); blocked {
			if !wasBlocked {
				r.cfg.Logger.Warn("outbox relay: the broker blocked the connection; claiming nothing until it unblocks",
					"owner", r.cfg.Owner, "reason", reason)
				wasBlocked = true
			}
			select {
			case <-p.stop.Done():
				return
			case <-time.After(r.cfg.PollInterval):
			}
			continue
		}
		if wasBlocked {
			r.cfg.Logger.Info("outbox relay: the broker unblocked the connection", "owner", r.cfg.Owner)
			wasBlocked = false
		}
		// A claim runs under grace, not ctx: once it has started it
		// completes, so a claim committed just as ctx ended is released
		// by the sender rather than left leased.
		rows, err := r.claim(p.grace)
		if err != nil {
			if p.stop.Err() != nil {
				return
			}
			r.cfg.Logger.Error("outbox relay: claim failed", "owner", r.cfg.Owner, "error", err)
			wait := retry.Backoff(failures, 50*time.Millisecond, 5*time.Second)
			failures++
			select {
			case <-p.stop.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		if len(rows) > 0 {
			b := &batch{rows: rows, claimedAt: r.cfg.Now(), deadline: time.Now().Add(r.cfg.LeaseDuration)}
			out <- b // the sender takes everything until out is closed
			if len(rows) >= r.cfg.BatchSize {
				continue // probably more waiting
			}
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-p.stop.Done():
			return
		case <-wake:
		case <-poll.C:
		}
	}
}

// sender publishes each claimed or handed-off batch without waiting for its
// confirms and passes it on. After ctx ends it passes batches on unsent, to
// be released; after a crash it drops them, leased, as a dead process would.
// Once the claimer is done it stops hand-offs and empties their queue the
// same way.
func (p *pipeline) sender(in <-chan *batch, out chan<- *batch) {
	defer close(out)
	r := p.r
	for in != nil {
		select {
		case b, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			p.forward(b, out)
		case b := <-r.direct:
			p.forward(p.merge(b), out)
		}
	}
	r.setOpen(false)
	for {
		select {
		case b := <-r.direct:
			p.forward(p.merge(b), out)
		default:
			return
		}
	}
}

// merge adds the hand-offs queued behind b to it, up to BatchSize rows (or
// b's own size, when that is more), so that under load the hand-offs of
// many consumer commits travel as one batch.
func (p *pipeline) merge(b *batch) *batch {
	for len(b.rows) < p.r.cfg.BatchSize {
		select {
		case more := <-p.r.direct:
			b.rows = append(b.rows, more.rows...)
			if more.deadline.Before(b.deadline) { // the first lease to run out bounds the batch
				b.deadline = more.deadline
			}
		default:
			return b
		}
	}
	return b
}

// forward gives b, claimed or handed off, its work context — bounded by its
// lease and by the drain — and sends it, or passes it on unsent, or drops
// it (after a crash). After ctx ended a claimed batch goes on unsent, to be
// released; a handed-over one, which the relay accepted while it was open,
// is still sent within the drain, so that what a stopping process's
// consumers committed last is published rather than left for a claim.
func (p *pipeline) forward(b *batch, out chan<- *batch) {
	b.work, b.finish = context.WithDeadline(p.grace, b.deadline)
	switch {
	case p.hasCrashed():
		b.finish()
		return
	case p.ctx.Err() == nil, b.handed && b.work.Err() == nil:
		p.send(b)
	}
	out <- b
}

func (p *pipeline) send(b *batch) {
	r := p.r
	msgs := make([]broker.Outgoing, len(b.rows))
	if r.tel.tracer != nil {
		b.spans = make([]trace.Span, len(b.rows))
	}
	for i := range b.rows {
		rw := &b.rows[i]
		if b.spans != nil {
			b.spans[i] = r.tel.startSend(p.ctx, rw, r.cfg.Owner)
		}
		msgs[i] = broker.Outgoing{Exchange: rw.env.Exchange, RoutingKey: rw.env.RoutingKey, Publishing: rw.env.Publishing()}
	}
	b.pending = r.pub.Send(b.work, msgs)
	b.sent = true
}

// awaiter waits for the confirms of each sent batch, in order, and passes
// it on to be settled.
func (p *pipeline) awaiter(in <-chan *batch, out chan<- *batch) {
	defer close(out)
	r := p.r
	for b := range in {
		if p.hasCrashed() {
			b.finish()
			continue
		}
		if b.sent {
			b.errs = b.pending.Wait(b.work)
			if r.tel.metrics.Enabled() || b.spans != nil {
				now := time.Now()
				for i := range b.rows {
					var span trace.Span
					if b.spans != nil {
						span = b.spans[i]
					}
					r.tel.published(p.ctx, span, &b.rows[i], b.errs[i], now)
				}
			}
			if r.cfg.afterPublish != nil {
				ids := make([]int64, len(b.rows))
				for i, rw := range b.rows {
					ids[i] = rw.id
				}
				if err := r.cfg.afterPublish(ids); err != nil {
					p.crash(err)
					b.finish()
					continue
				}
			}
		}
		out <- b
	}
}

// settler records the outcome of each batch, merging the batches that
// queued up while it was busy into one statement.
func (p *pipeline) settler(in <-chan *batch) {
	for b := range in {
		bs := []*batch{b}
	merge:
		for {
			select {
			case more, ok := <-in:
				if !ok {
					break merge
				}
				bs = append(bs, more)
			default:
				break merge
			}
		}
		p.settle(bs)
		for _, b := range bs {
			b.finish()
		}
	}
}

// settleContext bounds one settle: LeaseDuration while the relay runs (its
// retries give up then), ConfirmTimeout more once ctx ends (the drain; this
// also covers batches released unsent after the awaiter spent the drain),
// and nothing after a crash, which marks and releases nothing, as a dead
// process would not.
func (p *pipeline) settleContext() (context.Context, context.CancelFunc) {
	r := p.r
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), r.cfg.LeaseDuration)
	stopDrain := context.AfterFunc(p.ctx, func() {
		t := time.AfterFunc(r.cfg.ConfirmTimeout, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	go func() {
		select {
		case <-p.crashed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		stopDrain()
		cancel()
	}
}
