package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Metric names. Names of the OpenTelemetry semantic conventions are used
// where one exists; docs/observability.md lists types, units and labels.
const (
	MetricTransitions      = "saga.transitions"
	MetricStepLatency      = "saga.step.latency"
	MetricStepRoundTrip    = "saga.step.round_trip"
	MetricTimeouts         = "saga.timeouts"
	MetricCompensations    = "saga.compensations"
	MetricManualReviews    = "saga.manual_reviews"
	MetricConsumed         = "messaging.client.consumed.messages"
	MetricProcessDuration  = "messaging.process.duration"
	MetricConsumerMessages = "saga.consumer.messages"
	MetricConsumerRetries  = "saga.consumer.retries"
	MetricConsumerParked   = "saga.consumer.parked"
	MetricConsumerRestarts = "saga.consumer.reconnects"
	MetricSent             = "messaging.client.sent.messages"
	MetricPublishDelay     = "saga.outbox.publish.delay"
	MetricListenReconnects = "saga.outbox.listen.reconnects"
	MetricGoneRelayRows    = "saga.outbox.gone_relay.rows"
	MetricInstances        = "saga.instances"
	MetricStuck            = "saga.instances.stuck"
	MetricOutboxBacklog    = "saga.outbox.backlog"
	MetricOutboxOldestAge  = "saga.outbox.oldest_age"
	MetricParkedMessages   = "saga.parked.messages"
	metricSecondsUnit      = "s"
	metricMessageUnit      = "{message}"
)

// durationBounds are the histogram buckets (seconds) of every duration: step
// latency sits in single-digit milliseconds at low load, relay delays and
// process durations may reach seconds under backlog.
var durationBounds = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
	0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60,
}

// Metrics holds the runtime's synchronous instruments, created from one
// MeterProvider. Recording methods are no-ops (no attribute sets built) on a
// Metrics made from a disabled Providers, and safe on a nil *Metrics.
type Metrics struct {
	enabled bool

	transitions, timeouts, compensations, manualReviews metric.Int64Counter
	stepLatency, stepRoundTrip                          metric.Float64Histogram

	consumed, consumerMessages, retries, parked, restarts metric.Int64Counter
	processDuration                                       metric.Float64Histogram

	sent, listenReconnects, goneRelayRows metric.Int64Counter
	publishDelay                          metric.Float64Histogram
}

// NewMetrics creates every instrument from p.Meter. With metrics disabled
// it returns a Metrics whose methods do nothing.
func NewMetrics(p Providers) (*Metrics, error) {
	if !p.MetricsEnabled() {
		return &Metrics{}, nil
	}
	m := p.Meter.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit(metricSecondsUnit), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBounds...))
		errs = append(errs, err)
		return h
	}
	out := &Metrics{
		enabled:       true,
		transitions:   counter(MetricTransitions, "{transition}", "Triggers applied to saga instances, by result (applied, duplicate, late, conflicting, invalid, early)."),
		timeouts:      counter(MetricTimeouts, "{timeout}", "Step timeouts and saga deadlines fired."),
		compensations: counter(MetricCompensations, "{command}", "Compensating commands sent."),
		manualReviews: counter(MetricManualReviews, "{saga}", "Saga instances sent to manual review."),
		stepLatency:   histogram(MetricStepLatency, "The orchestrator's part of a step: from a delivered reply taken from the broker to the next command written, by the step of that command."),
		stepRoundTrip: histogram(MetricStepRoundTrip, "A step's round trip: from its command written to the outbox to its reply applied to the saga."),

		consumed:         counter(MetricConsumed, metricMessageUnit, "Messages delivered to a consumer."),
		consumerMessages: counter(MetricConsumerMessages, metricMessageUnit, "Deliveries settled by a consumer, by outcome (processed, duplicate, retry, park)."),
		retries:          counter(MetricConsumerRetries, metricMessageUnit, "Deliveries sent to a retry tier, by reason."),
		parked:           counter(MetricConsumerParked, metricMessageUnit, "Deliveries sent to the parking lot, by class and reason."),
		restarts:         counter(MetricConsumerRestarts, "{session}", "Consumer sessions restarted after a lost channel, connection or database."),
		processDuration:  histogram(MetricProcessDuration, "From a delivery's receipt to its acknowledgement."),

		sent:             counter(MetricSent, metricMessageUnit, "Outbox rows published by the relay; error.type is set when the broker did not confirm (nacked, returned, ...)."),
		listenReconnects: counter(MetricListenReconnects, "{reconnect}", "Relay LISTEN connections lost and re-established."),
		goneRelayRows:    counter(MetricGoneRelayRows, "{row}", "Outbox rows released from relays found gone (their liveness lock stayed free), to be claimed by others."),
		publishDelay:     histogram(MetricPublishDelay, "From a message's occurred-at to the broker's confirm of its publish."),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create telemetry instruments: %w", err)
	}
	return out, nil
}

// Enabled reports whether m records anything.
func (m *Metrics) Enabled() bool { return m != nil && m.enabled }

// ResultName is the saga.result value of a class: applied for
// sagadef.ClassNew, the class name otherwise.
func ResultName(c sagadef.Class) string {
	if c == sagadef.ClassNew {
		return "applied"
	}
	return c.String()
}

// TriggerType is the saga.trigger.type of a trigger kind.
func TriggerType(kind string) string {
	switch {
	case kind == sagadef.TriggerStart:
		return TriggerStart
	case kind == sagadef.TriggerTimeout:
		return TriggerTimeout
	case kind == sagadef.TriggerDeadline:
		return TriggerDeadline
	case kind == sagadef.TriggerStuck:
		return TriggerStuck
	case strings.HasPrefix(kind, "operator."):
		return TriggerOperator
	default:
		return TriggerMessage
	}
}

// Transition records one trigger applied to an instance of def.
// Depending on the result it also counts a timeout, the compensating
// commands sent and an entry into manual review. fromState is the state
// before the trigger ("" for a start).
func (m *Metrics) Transition(ctx context.Context, def *sagadef.Definition, triggerKind, fromState string, res sagadef.Result) {
	if !m.Enabled() {
		return
	}
	typ := KeySagaType.String(def.Name)
	tt := TriggerType(triggerKind)
	m.transitions.Add(ctx, 1, metric.WithAttributes(typ, KeySagaResult.String(ResultName(res.Class)), KeySagaTriggerType.String(tt)))
	if tt == TriggerTimeout || tt == TriggerDeadline {
		m.timeouts.Add(ctx, 1, metric.WithAttributes(typ, KeyTimeoutKind.String(tt), KeySagaStep.String(StepOf(def, fromState))))
	}
	for _, o := range res.Emit {
		if o.Message == nil {
			continue
		}
		info := o.Message.SagaMessageInfo()
		if info == nil {
			continue
		}
		if ref, ok := def.Lookup(info.FullName); ok && ref.Use == sagadef.UseCompensation {
			m.compensations.Add(ctx, 1, metric.WithAttributes(typ, KeySagaStep.String(ref.Step)))
		}
	}
	to := res.To
	if to == "" {
		to = res.Instance.State
	}
	if to == sagadef.StateManualReview && fromState != sagadef.StateManualReview {
		m.manualReviews.Add(ctx, 1, metric.WithAttributes(typ, KeySagaTriggerType.String(tt)))
	}
}

// StepLatency records the orchestrator's part of a step (PRODUCT's step
// latency, "reply in → next command out"): the time from a delivered
// message taken from the broker to the command it made the saga send,
// labelled with that command's step and phase ([PhaseCompensation] for a
// compensating command).
func (m *Metrics) StepLatency(ctx context.Context, sagaType, step, phase string, d time.Duration) {
	if !m.Enabled() {
		return
	}
	m.stepLatency.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(KeySagaType.String(sagaType), KeySagaStep.String(step),
		KeyStepPhase.String(phase)))
}

// StepRoundTrip records a step's round trip: the time from its command (or,
// in phase [PhaseCompensation], its compensating command) written to the
// outbox to its reply applied.
func (m *Metrics) StepRoundTrip(ctx context.Context, sagaType, step, phase string, d time.Duration) {
	if !m.Enabled() {
		return
	}
	m.stepRoundTrip.Record(ctx, max(d, 0).Seconds(), metric.WithAttributes(KeySagaType.String(sagaType), KeySagaStep.String(step),
		KeyStepPhase.String(phase)))
}

// ConsumerLabels are the attributes of one consumer's metrics; build them
// once with [ConsumerAttributes].
type ConsumerLabels struct {
	base []attribute.KeyValue
}

// ConsumerAttributes returns the labels of the consumer name consuming queue.
func ConsumerAttributes(name, queue string) ConsumerLabels {
	return ConsumerLabels{base: []attribute.KeyValue{AttrRabbitMQ, KeyDestinationName.String(queue), KeyConsumerGroup.String(name)}}
}

func (l ConsumerLabels) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(l.base)+len(kv))
	all = append(append(all, l.base...), kv...)
	return metric.WithAttributes(all...)
}

// Consumed counts n deliveries received.
func (m *Metrics) Consumed(ctx context.Context, l ConsumerLabels, n int) {
	if !m.Enabled() {
		return
	}
	m.consumed.Add(ctx, int64(n), l.with())
}

// Settled records a delivery acknowledged with outcome (processed,
// duplicate, retry, park) after d since its receipt.
func (m *Metrics) Settled(ctx context.Context, l ConsumerLabels, outcome string, d time.Duration) {
	if !m.Enabled() {
		return
	}
	o := KeyConsumerOutcome.String(outcome)
	m.consumerMessages.Add(ctx, 1, l.with(o))
	m.processDuration.Record(ctx, d.Seconds(), l.with(o))
}

// Retried counts a delivery sent to a retry tier for reason.
func (m *Metrics) Retried(ctx context.Context, l ConsumerLabels, reason string) {
	if !m.Enabled() {
		return
	}
	m.retries.Add(ctx, 1, l.with(KeyRetryReason.String(reason)))
}

// Parked counts a delivery sent to the parking lot.
func (m *Metrics) Parked(ctx context.Context, l ConsumerLabels, class, reason string) {
	if !m.Enabled() {
		return
	}
	m.parked.Add(ctx, 1, l.with(KeyParkClass.String(class), KeyParkReason.String(reason)))
}

// ConsumerRestarted counts a consumer session that ended and is restarted.
func (m *Metrics) ConsumerRestarted(ctx context.Context, l ConsumerLabels) {
	if !m.Enabled() {
		return
	}
	m.restarts.Add(ctx, 1, l.with())
}

// Sent records one publish of an outbox row to exchange: errorType is
// empty when the broker confirmed it, the failure otherwise (nacked,
// returned, ...). delay, recorded for confirmed publishes, is the time since
// the message occurred.
func (m *Metrics) Sent(ctx context.Context, exchange, errorType string, delay time.Duration) {
	if !m.Enabled() {
		return
	}
	dest := KeyDestinationName.String(exchange)
	if errorType != "" {
		m.sent.Add(ctx, 1, metric.WithAttributes(AttrRabbitMQ, dest, KeyOperationName.String("publish"), KeyErrorType.String(errorType)))
		return
	}
	m.sent.Add(ctx, 1, metric.WithAttributes(AttrRabbitMQ, dest, KeyOperationName.String("publish")))
	m.publishDelay.Record(ctx, max(delay, 0).Seconds(), metric.WithAttributes(AttrRabbitMQ, dest))
}

// ListenReconnected counts a relay LISTEN connection that was lost.
func (m *Metrics) ListenReconnected(ctx context.Context) {
	if !m.Enabled() {
		return
	}
	m.listenReconnects.Add(ctx, 1)
}

// GoneRelayRowsReleased counts outbox rows a relay released from another
// relay it found gone.
func (m *Metrics) GoneRelayRowsReleased(ctx context.Context, rows int) {
	if !m.Enabled() || rows <= 0 {
		return
	}
	m.goneRelayRows.Add(ctx, int64(rows))
}

// StepOf returns the step a state of def belongs to ("" for terminal and
// manual-review states and unknown states).
func StepOf(def *sagadef.Definition, state string) string {
	if s, ok := def.LookupState(state); ok {
		return s.Step
	}
	return ""
}
