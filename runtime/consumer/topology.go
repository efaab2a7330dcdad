package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/broker"
)

// checkTopology verifies that the work queue, the parking lot and every tier
// the retry policy can use exist.
func (c *Consumer) checkTopology(ctx context.Context) error {
	// The queues broker.WorkQueue declares for the policy (whatever the
	// type: only the names matter here). It stops at the last tier, which
	// is reused, so a budget of math.MaxInt attempts is no longer to check
	// than one of len(Tiers)+1.
	var queues []string
	for _, q := range broker.WorkQueue(c.cfg.Queue, "", c.cfg.Retry) {
		queues = append(queues, q.Name)
	}
	ch, err := c.cfg.Conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, q := range queues {
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
				return &topologyError{queue: q}
			}
			return fmt.Errorf("check queue %q: %w", q, err)
		}
	}
	return c.checkTiers(ctx)
}

// checkTiers verifies that every tier queue delays and dead-letters the way
// broker.WorkQueue declares it, of either queue type: a tier that exists
// without that (declared by hand, by another tool, or with another TTL under
// the name) would drop every retry when its TTL expires, or route it
// elsewhere, and nothing would say so. A passive declare cannot see
// arguments; declaring the tier again as WorkQueue does changes nothing when
// they match, and the broker refuses it (PRECONDITION_FAILED, which closes
// the channel) when they do not, naming one argument that differs. Run
// refuses to start when that is the TTL or the dead-letter exchange or
// routing key (they are the same for either queue type, so the difference is
// real). A tier that differs only in other arguments (a lazy classic queue,
// a delivery limit) returns its retries; when neither declaration names one
// of the three, the consumer cannot tell whether they match too, logs the
// broker's answers and starts. A consumer whose user may not declare queues
// (ACCESS_REFUSED) cannot check either: it logs that and goes on.
func (c *Consumer) checkTiers(ctx context.Context) error {
	type tier struct {
		name string
		as   []broker.Queue // the tier as WorkQueue declares it, by queue type
	}
	var tiers []tier
	for i, qt := range []broker.QueueType{broker.QueueQuorum, broker.QueueClassic} {
		qs := broker.WorkQueue(c.cfg.Queue, qt, c.cfg.Retry)
		for j, q := range qs[1 : len(qs)-1] {
			if i == 0 {
				tiers = append(tiers, tier{name: q.Name})
			}
			tiers[j].as = append(tiers[j].as, q)
		}
	}
	first := 0 // the queue type to try first: the one the last tier matched
tiers:
	for _, t := range tiers {
		var differ []string
		for k := range t.as {
			q := t.as[(first+k)%len(t.as)]
			err := c.redeclare(ctx, q)
			var amqpErr *amqp.Error
			switch {
			case err == nil:
				first = (first + k) % len(t.as)
				continue tiers
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
				c.log.Warn("cannot check the arguments of a retry tier (no permission to declare it); make sure it dead-letters back to the work queue",
					slog.String("tier", t.name), slog.Any("error", err))
				continue tiers
			case errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed:
				if slices.Contains(retryArgs, inequivalentArg(amqpErr.Reason)) {
					return &topologyError{queue: t.name, mismatch: fmt.Errorf("as a %s queue: %s", q.Type, amqpErr.Reason)}
				}
				differ = append(differ, fmt.Sprintf("as a %s queue: %s", q.Type, amqpErr.Reason))
			default:
				return fmt.Errorf("check the arguments of queue %q: %w", t.name, err)
			}
		}
		c.log.Warn("a retry tier has other arguments than broker.WorkQueue gives it; the broker named none of its delay and dead-letter arguments, so those were not checked: make sure it dead-letters back to the work queue",
			slog.String("tier", t.name), slog.String("differences", strings.Join(differ, "; ")))
	}
	return nil
}

// retryArgs are the tier arguments a retry's return depends on.
var retryArgs = []string{broker.ArgMessageTTL, broker.ArgDeadLetterExchange, broker.ArgDeadLetterRoutingKey}

// inequivalentArg returns the argument a PRECONDITION_FAILED reason of
// queue.declare names ("inequivalent arg 'x-message-ttl' for queue ..."),
// or "".
func inequivalentArg(reason string) string {
	const prefix = "inequivalent arg '"
	i := strings.Index(reason, prefix)
	if i < 0 {
		return ""
	}
	rest := reason[i+len(prefix):]
	if j := strings.IndexByte(rest, '\''); j >= 0 {
		return rest[:j]
	}
	return ""
}

// redeclare declares q on a channel of its own (a refusal closes it).
func (c *Consumer) redeclare(ctx context.Context, q broker.Queue) error {
	ch, err := c.cfg.Conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	return broker.Declare(ctx, ch, broker.Topology{Queues: []broker.Queue{q}})
}
