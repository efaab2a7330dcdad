package host

// The broker side of Start: the merged topology, the connection and the
// declaration.

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/retry"
	"github.com/protosaga/saga/runtime/service"
)

// Topology returns the merged topology of every registered participant,
// subscriber and saga, with the configured queue type and retry tiers: what Start
// declares.
func (h *Host) Topology() broker.Topology {
	h.mu.Lock()
	defer h.mu.Unlock()
	var t broker.Topology
	seen := map[string]bool{}
	add := func(p service.Package) {
		if seen[p.Path] {
			return
		}
		seen[p.Path] = true
		t = t.Merge(p.Topology(h.cfg.QueueType, h.cfg.Retry))
	}
	for _, p := range h.participants {
		add(p.Package)
	}
	for _, s := range h.subscribers {
		add(s.Package)
	}
	for _, s := range h.sagas {
		add(s.Package)
	}
	return t
}

// connect dials the broker and declares the topology.
func (h *Host) connect(ctx context.Context, r *running) error {
	dial := func(role string) (*broker.Conn, error) {
		c, err := broker.Dial(ctx, h.cfg.AMQPURL, broker.ConnConfig{
			TLS: h.cfg.TLS, Name: h.cfg.Service + "-" + role, Logger: h.log, Meter: h.cfg.Telemetry.Meter,
		})
		if err != nil {
			return nil, fmt.Errorf("connect to the broker to %s: %w", role, err)
		}
		return c, nil
	}
	var err error
	if r.pub, err = dial("publish"); err != nil {
		return err
	}
	if r.sub, err = dial("consume"); err != nil {
		return err
	}
	topo := h.Topology()
	if err := topo.Validate(); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	for attempt := 1; ; attempt++ {
		err := declare(ctx, r.pub, topo)
		if err == nil {
			return nil
		}
		if legacy, queue, ok := broker.LegacyWorkQueue(topo, err); ok {
			h.log.Warn("a work queue exists without the dead-letter arguments this runtime declares; "+
				"unless a policy gives it this dead-lettering, a message the broker gives up on "+
				"(RabbitMQ 4's quorum delivery limit) is dropped instead of parked (docs/reliability.md, upgrading)",
				"queue", queue, "policy", broker.LegacyWorkQueuePolicy(queue), "error", err)
			topo = legacy
			attempt--
			continue
		}
		if !retryDeclare(err) || attempt == declareAttempts || ctx.Err() != nil {
			return err
		}
		h.log.Warn("declaring the topology failed; retrying", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retry.Backoff(attempt, time.Second, 10*time.Second)):
		}
	}
}

// declareAttempts bounds Start's tries at declaring the topology.
const declareAttempts = 5

// declare declares topo on a channel of its own.
func declare(ctx context.Context, conn *broker.Conn, topo broker.Topology) error {
	ch, err := conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("open a channel to declare the topology: %w", err)
	}
	defer ch.Close()
	if err := broker.Declare(ctx, ch, topo); err != nil {
		return fmt.Errorf("declare topology: %w", err)
	}
	return nil
}

// retryDeclare reports whether a failed declaration may succeed when tried
// again: the broker's internal errors (a quorum queue whose leader election
// timed out on a loaded node) and lost channels or connections. A
// declaration the broker refuses (an existing entity with other arguments,
// access refused) fails at once.
func retryDeclare(err error) bool {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code == amqp.InternalError || ae.Code == amqp.ConnectionForced || ae.Code == amqp.ChannelError || ae.Recover
	}
	return errors.Is(err, amqp.ErrClosed)
}
