package telemetry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/sagadef"
)

// GaugeOption tunes the database gauges.
type GaugeOption func(*gaugeConfig)

type gaugeConfig struct {
	queryTimeout    time.Duration
	stuckGrace      time.Duration
	includeTerminal bool
}

// WithQueryTimeout bounds the queries of one collection; default 5 s.
func WithQueryTimeout(d time.Duration) GaugeOption {
	return func(c *gaugeConfig) { c.queryTimeout = d }
}

// WithStuckGrace is how far past due an instance must be to count as stuck
// (see [StuckRule]): 0 keeps the default [DefaultStuckGrace], a negative
// value means none, as for the admin server's Config.StuckGrace. Give both
// the same value, so that the console lists what the gauge counts.
func WithStuckGrace(d time.Duration) GaugeOption {
	return func(c *gaugeConfig) {
		if d != 0 {
			c.stuckGrace = d
		}
	}
}

// WithDefaultSLA does nothing.
//
// Deprecated: it was described as the limit for steps without a timeout,
// but every step has one (sagadef.Definition.Compile refuses a step
// without), so it never applied; stuck instances follow [StuckRule].
func WithDefaultSLA(time.Duration) GaugeOption {
	return func(*gaugeConfig) {}
}

// WithTerminalStates makes saga.instances count terminal states (COMPLETED,
// FAILED, CANCELLED) too. Off by default: those rows only grow, and counting
// them on every scrape costs a scan of the table; the saga.transitions
// counter gives their rates.
func WithTerminalStates() GaugeOption {
	return func(c *gaugeConfig) { c.includeTerminal = true }
}

func newGaugeConfig(opts []GaugeOption) gaugeConfig {
	c := gaugeConfig{queryTimeout: 5 * time.Second, stuckGrace: DefaultStuckGrace}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// sagaGauge is what one definition contributes to the saga gauges.
type sagaGauge struct {
	def    *sagadef.Definition
	states []string
	stuck  StuckRule
	sql    string // sagaGaugeSQL of the definition's table and states
}

// RegisterSagaGauges registers two observable gauges on meter, read from
// pool at each collection:
//
//   - saga.instances{saga.type, saga.state}: instances per state (every
//     non-terminal state of each definition is reported, 0 included;
//     terminal states only with [WithTerminalStates]);
//   - saga.instances.stuck{saga.type, saga.state}: instances in a step or
//     compensating state that are stuck by [StuckRule] with the grace of
//     [WithStuckGrace], by the database clock.
//
// It issues one query per definition per collection. Unregister the
// returned registration to stop.
func RegisterSagaGauges(meter metric.Meter, pool *pgxpool.Pool, defs []*sagadef.Definition, opts ...GaugeOption) (metric.Registration, error) {
	if meter == nil || pool == nil {
		return nil, errors.New("register saga gauges: meter and pool are required")
	}
	cfg := newGaugeConfig(opts)
	gauges := make([]sagaGauge, 0, len(defs))
	for _, d := range defs {
		g, err := newSagaGauge(d, cfg)
		if err != nil {
			return nil, fmt.Errorf("register saga gauges: %w", err)
		}
		gauges = append(gauges, g)
	}
	instances, err := meter.Int64ObservableGauge(MetricInstances, metric.WithUnit("{saga}"),
		metric.WithDescription("Saga instances by type and state."))
	if err != nil {
		return nil, fmt.Errorf("register saga gauges: %w", err)
	}
	stuck, err := meter.Int64ObservableGauge(MetricStuck, metric.WithUnit("{saga}"),
		metric.WithDescription("Saga instances waiting on a step past its timeout or their deadline, or without progress beyond the step's timeout, by more than the grace."))
	if err != nil {
		return nil, fmt.Errorf("register saga gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.queryTimeout)
		defer cancel()
		var errs []error
		for _, g := range gauges {
			counts, stuckCounts, err := g.query(ctx, pool)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			typ := KeySagaType.String(g.def.Name)
			for _, s := range g.states {
				st := KeySagaState.String(s)
				o.ObserveInt64(instances, counts[s], metric.WithAttributes(typ, st))
				if g.stuck.Waits(s) {
					o.ObserveInt64(stuck, stuckCounts[s], metric.WithAttributes(typ, st))
				}
			}
		}
		return errors.Join(errs...)
	}, instances, stuck)
	if err != nil {
		return nil, fmt.Errorf("register saga gauges: %w", err)
	}
	return reg, nil
}

func newSagaGauge(d *sagadef.Definition, cfg gaugeConfig) (sagaGauge, error) {
	if d == nil || d.Name == "" || len(d.States) == 0 {
		return sagaGauge{}, errors.New("definition is nil, unnamed or not compiled")
	}
	if d.Table == "" {
		return sagaGauge{}, fmt.Errorf("definition %s has no table", d.Name)
	}
	g := sagaGauge{def: d, stuck: NewStuckRule(d, cfg.stuckGrace)}
	for _, s := range d.States {
		if s.Kind == sagadef.StateKindTerminal && !cfg.includeTerminal {
			continue
		}
		g.states = append(g.states, s.Name)
	}
	g.sql = sagaGaugeSQL(pgx.Identifier(strings.Split(d.Table, ".")).Sanitize(), g.states)
	return g, nil
}

// sagaGaugeSQL counts the instances of table (quoted) in states, and those
// of them stuck by the rule of [StuckRule.Args] $1, $2, $3, per state. With
// the states named (see [StatesSQL]), PostgreSQL reads the in-flight
// instances through the state index when finished ones are most of the
// table, instead of scanning the whole table at every scrape.
func sagaGaugeSQL(table string, states []string) string {
	return `
SELECT t.state, count(*), count(*) FILTER (WHERE ` + StuckSQL("now()", "$1", "$2", "$3") + `)
FROM ` + table + ` t
WHERE ` + StatesSQL(states...) + `
GROUP BY t.state`
}

// query counts instances and stuck instances per state.
func (g sagaGauge) query(ctx context.Context, pool *pgxpool.Pool) (counts, stuck map[string]int64, err error) {
	states, limits, grace := g.stuck.Args()
	rows, err := pool.Query(ctx, g.sql, states, limits, grace)
	if err != nil {
		return nil, nil, fmt.Errorf("count saga %s instances: %w", g.def.Name, err)
	}
	counts, stuck = make(map[string]int64, len(g.states)), make(map[string]int64, len(g.states))
	var (
		state string
		n, s  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &n, &s}, func() error {
		counts[state], stuck[state] = n, s
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("count saga %s instances: %w", g.def.Name, err)
	}
	return counts, stuck, nil
}

// RegisterOutboxGauges registers observable gauges of the runtime tables on
// meter, read from pool at each collection:
//
//   - saga.outbox.backlog: unpublished outbox rows;
//   - saga.outbox.oldest_age (s): how long the longest-waiting unpublished
//     row has been pending (saga_outbox_pending.pending_since: since it was
//     written, or since an operator's replay made it pending again), by the
//     database clock (0 when there is none); the same scan of the pending
//     rows gives the backlog;
//   - saga.parked.messages{messaging.destination.name}: open parked
//     messages (neither replayed nor dismissed), per original queue; a
//     queue whose parked messages are all closed is reported as 0.
func RegisterOutboxGauges(meter metric.Meter, pool *pgxpool.Pool, opts ...GaugeOption) (metric.Registration, error) {
	if meter == nil || pool == nil {
		return nil, errors.New("register outbox gauges: meter and pool are required")
	}
	cfg := newGaugeConfig(opts)
	backlog, err := meter.Int64ObservableGauge(MetricOutboxBacklog, metric.WithUnit(metricMessageUnit),
		metric.WithDescription("Outbox rows not yet published."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	age, err := meter.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit(metricSecondsUnit),
		metric.WithDescription("Age of the oldest unpublished outbox row."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	parkedGauge, err := meter.Int64ObservableGauge(MetricParkedMessages, metric.WithUnit(metricMessageUnit),
		metric.WithDescription("Parked messages neither replayed nor dismissed, by original queue."))
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.queryTimeout)
		defer cancel()
		var (
			n    int64
			secs float64
		)
		err := pool.QueryRow(ctx, `
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(pending_since))::float8, 0) FROM saga_outbox_pending`).Scan(&n, &secs)
		if err != nil {
			return fmt.Errorf("measure outbox backlog: %w", err)
		}
		o.ObserveInt64(backlog, n)
		o.ObserveFloat64(age, max(secs, 0))
		// Every queue that has parked rows, open or not: one whose rows
		// were all replayed or dismissed is reported as 0, so an alert on
		// it clears (one read of the parking lot, which holds exceptions).
		counts, err := parked.CountByQueue(ctx, pool)
		if err != nil {
			return err
		}
		queues := make([]string, 0, len(counts))
		for q := range counts {
			queues = append(queues, q)
		}
		slices.Sort(queues)
		for _, q := range queues {
			o.ObserveInt64(parkedGauge, counts[q], metric.WithAttributes(attribute.String(string(KeyDestinationName), q)))
		}
		return nil
	}, backlog, age, parkedGauge)
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	return reg, nil
}
