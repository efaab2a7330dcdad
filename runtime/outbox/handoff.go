package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
)

// directDepth is how many hand-offs (one per committed transaction)
// wait for the sender at most; hand-offs beyond it are released to be
// claimed instead.
const directDepth = 256

// relayOf returns the relay of this process that tx's committed rows are
// handed to, or nil.
//
// The owner of a transaction names that relay on the transaction's wake set
// (txq.Wakes.HandOffTo): a consumer given one (consumer.Config.Relay), a
// saga engine given one (saga.Engine.HandOffTo: Start, Operate, InTx, the
// timeout scanner, the admin server's repairs through the engine). Then
// [Enqueue] hands its rows to r once that transaction commits, instead of
// waking relays to claim them. The rows are inserted already leased to r
// (their pending rows have lease_owner, lease_until = the transaction's
// start + LeaseDuration, attempts 1), so no relay claims them meanwhile and
// r publishes them without a claim statement: the claim and its row update
// are skipped, and so is the notification round trip. The guarantees do not
// change:
//
//   - r gets the rows only after the transaction committed, and only those
//     of handlers whose writes committed (a failed handler's savepoint, a
//     rolled-back transaction hand over nothing);
//   - when r is not running, or is stopping, Enqueue writes the rows
//     unleased as usual; when r stops or its queue is full by the time the
//     commit is done, the rows are released (lease cleared, relays woken)
//     for any relay to claim;
//   - when the process dies between commit and publish, the rows are
//     published by any relay once it finds r gone (a few polls after its
//     database session ends, see the package documentation) or at the
//     latest when their lease runs out, as for a relay that died holding a
//     claim.
//
// Enqueue in a transaction of the caller's own is not affected, nor is
// Enqueue on a savepoint a handler opened (its rows are claimed as usual).
// A handler must not use the transaction it was given while a savepoint of
// its own is open and then roll that savepoint back: rows written and then
// undone that way could be handed over.
func relayOf(tx pgx.Tx) *Relay {
	r, _ := txq.HandOff(tx).(*Relay)
	return r
}

func (r *Relay) setOpen(open bool) {
	r.mu.Lock()
	r.open = open
	r.mu.Unlock()
}

func (r *Relay) accepting() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.open
}

// leasedRows is what one Enqueue wrote leased to a relay.
type leasedRows struct {
	rows     []row
	deadline time.Time // when their lease runs out, by the local clock
}

// scan reads the ids and remaining lease insertLeasedSQL returns.
func (lr *leasedRows) scan(rows pgx.Rows) error {
	byID := make(map[string]int64, len(lr.rows))
	var (
		id, leftMS int64
		mid        string
	)
	now := time.Now()
	_, err := pgx.ForEachRow(rows, []any{&id, &mid, &leftMS}, func() error {
		byID[mid] = id
		if d := now.Add(time.Duration(leftMS) * time.Millisecond); lr.deadline.IsZero() || d.Before(lr.deadline) {
			lr.deadline = d
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range lr.rows {
		var ok bool
		if lr.rows[i].id, ok = byID[lr.rows[i].env.MessageID]; !ok {
			return fmt.Errorf("outbox insert returned no id for message %s", lr.rows[i].env.MessageID)
		}
	}
	return nil
}

// handoff collects the leased rows of one transaction's kept handlers and
// hands them to the relay once, after the commit (a txq.Collector).
type handoff struct {
	r        *Relay
	rows     []row
	deadline time.Time
}

func (h *handoff) add(lr *leasedRows) {
	h.rows = append(h.rows, lr.rows...)
	if h.deadline.IsZero() || lr.deadline.Before(h.deadline) {
		h.deadline = lr.deadline
	}
}

// Flush hands the collected rows over.
func (h *handoff) Flush(ctx context.Context) {
	if len(h.rows) > 0 {
		h.r.handoff(ctx, h)
	}
}

// handoff queues committed rows for the sender. When the relay is not
// accepting or its queue is full, it releases them for a claim instead.
func (r *Relay) handoff(ctx context.Context, h *handoff) {
	r.mu.RLock()
	queued := false
	if r.open {
		select {
		case r.direct <- &batch{rows: h.rows, claimedAt: r.cfg.Now(), deadline: h.deadline, handed: true}:
			queued = true
		default:
		}
	}
	r.mu.RUnlock()
	if queued {
		r.handed.Add(int64(len(h.rows)))
		return
	}
	ids := make([]int64, len(h.rows))
	for i, rw := range h.rows {
		ids[i] = rw.id
	}
	// Typically at shutdown, when the consumer's context may be ending
	// too: the release still runs, briefly.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ConfirmTimeout)
	defer cancel()
	if _, err := r.cfg.Pool.Exec(ctx, releaseHandoffSQL, ids, r.cfg.Owner); err != nil {
		r.cfg.Logger.Warn("outbox relay: could not take committed rows nor release them; they are published when their lease runs out",
			"owner", r.cfg.Owner, "rows", len(ids), "first_message_id", h.rows[0].env.MessageID,
			"lease", r.cfg.LeaseDuration, "error", err)
	}
}

// releaseHandoffSQL frees rows born leased to a relay that could not take
// them, and wakes relays to claim them.
const releaseHandoffSQL = `
WITH released AS (
  UPDATE saga_outbox_pending SET lease_owner = NULL, lease_until = NULL
  WHERE id = ANY($1::bigint[]) AND lease_owner = $2 AND attempts = 1
  RETURNING id
)
SELECT pg_notify('` + NotifyChannel + `', '') WHERE EXISTS (SELECT FROM released)`
