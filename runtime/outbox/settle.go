package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
)

func (p *pipeline) settle(bs []*batch) {
	r := p.r
	var s settlement
	for _, b := range bs {
		for i, rw := range b.rows {
			switch {
			case !b.sent: // free it for anyone at once
				s.release(rw, 0)
				s.unsent++
			case b.errs[i] == nil:
				s.done = append(s.done, rw.id)
				s.doneAttempts = append(s.doneAttempts, rw.attempts)
			default:
				s.release(rw, retryDelay(b.errs[i], rw.attempts))
				r.cfg.Logger.Warn("outbox relay: publish failed; will retry",
					"owner", r.cfg.Owner, "message_id", rw.env.MessageID, "message_type", rw.env.MessageType,
					"saga_id", rw.env.SagaID, "correlation_id", rw.env.CorrelationID, "causation_id", rw.env.CausationID,
					"exchange", rw.env.Exchange, "routing_key", rw.env.RoutingKey, "attempts", rw.attempts, "error", b.errs[i])
			}
		}
	}
	// Marking confirmed rows needs no lease, so the settle is not bound to
	// the batches' leases (the oldest may be nearly out while younger ones
	// merged with it are fresh): it gets its own context.
	oldest := bs[0]
	ctx, cancel := p.settleContext()
	defer cancel()
	if err := r.settle(ctx, r.cfg.Now(), s); err != nil {
		r.cfg.Logger.Error("outbox relay: settle failed", "owner", r.cfg.Owner, "error", err)
		return
	}
	r.cfg.Logger.Debug("outbox relay: batches done", "owner", r.cfg.Owner, "batches", len(bs),
		"published", len(s.done), "failed", len(s.failed)-s.unsent, "released_unsent", s.unsent,
		"took", r.cfg.Now().Sub(oldest.claimedAt))
}

// settlement is what one settle statement records.
type settlement struct {
	done           []int64
	doneAttempts   []int32 // the attempts of the claim each done row was published under
	failed, delays []int64 // released rows, with their backoff in ms
	attempts       []int32 // and the attempts of the claim they were published under
	unsent         int     // released rows that were never published
}

// latestClaims keeps one entry per row id: that of its latest claim, the
// one with the most attempts, with its delay when delays is not nil. A row
// is listed twice only when it was claimed again after its lease ran out
// while the older claim's settle still waited; the settle statements read
// the first entry of an id, and no claim but the latest can match the row. The
// slices are returned as they are when no id repeats.
func latestClaims(ids []int64, attempts []int32, delays []int64) ([]int64, []int32, []int64) {
	if len(ids) < 2 {
		return ids, attempts, delays
	}
	at := make(map[int64]int, len(ids)) // id -> index of its entry in the result
	for i, id := range ids {
		if _, seen := at[id]; seen {
			break
		}
		at[id] = i
		if i == len(ids)-1 {
			return ids, attempts, delays
		}
	}
	clear(at)
	var keptIDs []int64
	var keptAttempts []int32
	var keptDelays []int64
	for i, id := range ids {
		j, seen := at[id]
		if !seen {
			at[id] = len(keptIDs)
			keptIDs = append(keptIDs, id)
			keptAttempts = append(keptAttempts, attempts[i])
			if delays != nil {
				keptDelays = append(keptDelays, delays[i])
			}
			continue
		}
		if attempts[i] > keptAttempts[j] {
			keptAttempts[j] = attempts[i]
			if delays != nil {
				keptDelays[j] = delays[i]
			}
		}
	}
	return keptIDs, keptAttempts, keptDelays
}

func (s *settlement) release(rw row, delay time.Duration) {
	s.failed = append(s.failed, rw.id)
	s.delays = append(s.delays, delay.Milliseconds())
	s.attempts = append(s.attempts, rw.attempts)
}

// retryDelay is how long a row whose publish failed waits before it can be
// claimed again. Nacks, returns, missing exchanges and messages AMQP cannot
// carry (a broker that refuses, a missing binding or exchange, a row written
// around Enqueue's checks) back off exponentially with the row's attempts,
// so a row that cannot be published does not spin. Connection-level
// failures of a row that was written retry at once the first two times
// (the Conn's reconnect paces those), then back off too: a row whose
// publish makes the broker close the channel (a body over its
// max_message_size) fails every message in flight with it, and must not
// come back at once to do it again. A row never written (ErrNotSent: no
// connection, a blocked one, a failure before it in its batch) retries at
// once, however often it was claimed.
func retryDelay(err error, attempts int32) time.Duration {
	const minDelay, maxDelay = 100 * time.Millisecond, 30 * time.Second
	if errors.Is(err, broker.ErrNacked) || errors.Is(err, broker.ErrReturned) || errors.Is(err, broker.ErrNoExchange) ||
		errors.Is(err, broker.ErrInvalidMessage) {
		return retry.Backoff(int(attempts)-1, minDelay, maxDelay)
	}
	if attempts < 3 || errors.Is(err, broker.ErrNotSent) {
		return 0 // a row never written cannot be what closed the channel
	}
	return retry.Backoff(int(attempts)-3, minDelay, maxDelay)
}

// settleDoneCTEs finds its rows by id = ANY(ids) and checks each row's claim
// by the attempts at its id's position in the parallel array, instead of
// joining the table with unnest(ids, attempts). The relay prepares it in its
// first seconds, when saga_outbox_pending may be new, never analyzed or
// just emptied, and a prepared statement keeps the generic plan it settles
// on then: for the join that plan was a sequential scan of the pending
// table hashed against the batch, kept while the table grew (every message
// inserts and deletes a pending row, so the table fills with dead rows).
// id = ANY(...) is an index condition whatever the statistics, and
// array_position costs less than the join even for 500 rows
// (docs/benchmarks.md). Each id is listed once (see latestClaims).
const settleDoneCTEs = `
WITH done AS (
  DELETE FROM saga_outbox_pending p
  WHERE p.id = ANY($1::bigint[]) AND p.attempts = ($2::int4[])[array_position($1::bigint[], p.id)]
    AND (p.lease_owner = $3 OR p.lease_owner IS NULL)
  RETURNING p.id, p.attempts
), sent AS (
  INSERT INTO saga_outbox_sent (id, published_at, attempts, relay)
  SELECT id, now(), attempts, $3 FROM done
  ON CONFLICT (id) DO NOTHING
)`

// settleDoneSQL settles confirmed rows only, the usual case. Given an empty
// array of released rows, settleSQL's custom plans drop the released part
// (a constant false), look cheaper than its generic plan, and PostgreSQL
// goes on planning it anew at most executions; this statement keeps its
// generic plan.
const settleDoneSQL = settleDoneCTEs + `
SELECT (SELECT count(*) FROM done), 0::bigint`

// settleSQL settles confirmed rows ($1–$3) and releases failed ones, each
// with its backoff in ms ($4–$6).
const settleSQL = settleDoneCTEs + `, released AS (
  UPDATE saga_outbox_pending p SET lease_owner = NULL,
    lease_until = now() + ($5::bigint[])[array_position($4::bigint[], p.id)] * interval '1 millisecond'
  WHERE p.id = ANY($4::bigint[]) AND p.lease_owner = $3 AND p.attempts = ($6::int4[])[array_position($4::bigint[], p.id)]
  RETURNING p.id
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM released)`

// settle records done rows as published and releases failed rows, in one
// statement (one commit for however many batches s covers): a published
// row's pending row is deleted and a saga_outbox_sent row says when, by
// which relay and after how many leases. Both happen only while the claim
// a row was published under is still the row's latest (same attempts) and
// ours. A late settle, after our lease ran out, therefore neither frees
// nor records a row that was claimed again since (its new claim settles
// it), nor one an operator's Republish made pending again after another
// relay recorded it: Republish carries over the attempts of the claim that
// was recorded, so the replayed row never matches an older claim, and the
// replay is published; and a replay of a row still pending counts one claim
// more, so no claim from before it matches either. A confirmed row whose lease was cleared but not
// claimed again (other relays took this one for dead and released its
// rows) is still recorded: its attempts are still our claim's, and no
// other claim can have published it yet. A failed row is released only
// while the lease is still ours. Database errors
// are retried for up to LeaseDuration from start (and while ctx lasts):
// giving up early only causes duplicates.
func (r *Relay) settle(ctx context.Context, start time.Time, s settlement) error {
	done, doneAttempts, failed, delays, attempts := s.done, s.doneAttempts, s.failed, s.delays, s.attempts
	done, doneAttempts, _ = latestClaims(done, doneAttempts, nil)
	failed, attempts, delays = latestClaims(failed, attempts, delays)
	if done == nil {
		done, doneAttempts = []int64{}, []int32{}
	}
	deadline := start.Add(r.cfg.LeaseDuration)
	for attempt := 0; ; attempt++ {
		var marked, released int64
		var err error
		if len(failed) == 0 {
			err = r.cfg.Pool.QueryRow(ctx, settleDoneSQL, done, doneAttempts, r.cfg.Owner).Scan(&marked, &released)
		} else {
			err = r.cfg.Pool.QueryRow(ctx, settleSQL, done, doneAttempts, r.cfg.Owner, failed, delays, attempts).Scan(&marked, &released)
		}
		if err == nil {
			r.published.Add(marked)
			r.failed.Add(int64(len(s.failed) - s.unsent))
			if lost := int64(len(done)) - marked; lost > 0 {
				r.cfg.Logger.Warn("outbox relay: confirmed rows were claimed again since this relay's claim (its lease ran out, or it was taken for dead); the newer claim, or an operator's replay, publishes them again",
					"owner", r.cfg.Owner, "rows", lost, "confirmed", len(done), "lease", r.cfg.LeaseDuration)
			}
			return nil
		}
		wait := retry.Backoff(attempt, 20*time.Millisecond, time.Second)
		if r.cfg.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("mark %d outbox rows published and release %d (they will be published again): %w", len(done), len(failed), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
