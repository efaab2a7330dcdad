package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// sagaGauge is what one definition contributes to the saga gauges.
type sagaGauge struct {
	def    *sagadef.Definition
	states []string
	stuck  StuckRule
	sql    string // sagaGaugeSQL of the definition's table and states
}

// RegisterGauges registers two observable gauges on meter, read from
// pool at each collection:
//
//   - saga.instances{saga.type, saga.state}: instances per state (every
//     non-terminal state of each definition is reported, 0 included;
//     terminal states only with telemetry.WithTerminalStates);
//   - saga.instances.stuck{saga.type, saga.state}: instances in a step or
//     compensating state that are stuck by [StuckRule] with the grace of
//     telemetry.WithStuckGrace, by the database clock.
//
// It issues one query per definition per collection. Unregister the
// returned registration to stop.
func RegisterGauges(meter metric.Meter, pool *pgxpool.Pool, defs []*sagadef.Definition, opts ...telemetry.GaugeOption) (metric.Registration, error) {
	if meter == nil || pool == nil {
		return nil, errors.New("register saga gauges: meter and pool are required")
	}
	cfg := telemetry.NewGaugeConfig(opts...)
	if cfg.StuckGrace == 0 {
		cfg.StuckGrace = DefaultStuckGrace
	}
	gauges := make([]sagaGauge, 0, len(defs))
	for _, d := range defs {
		g, err := newSagaGauge(d, cfg)
		if err != nil {
			return nil, fmt.Errorf("register saga gauges: %w", err)
		}
		gauges = append(gauges, g)
	}
	instances, err := meter.Int64ObservableGauge(telemetry.MetricInstances, metric.WithUnit("{saga}"),
		metric.WithDescription("Saga instances by type and state."))
	if err != nil {
		return nil, fmt.Errorf("register saga gauges: %w", err)
	}
	stuck, err := meter.Int64ObservableGauge(telemetry.MetricStuck, metric.WithUnit("{saga}"),
		metric.WithDescription("Saga instances waiting on a step past its timeout or their deadline, or without progress beyond the step's timeout, by more than the grace."))
	if err != nil {
		return nil, fmt.Errorf("register saga gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
		defer cancel()
		var errs []error
		for _, g := range gauges {
			counts, stuckCounts, err := g.query(ctx, pool)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			typ := telemetry.KeySagaType.String(g.def.Name)
			for _, s := range g.states {
				st := telemetry.KeySagaState.String(s)
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

func newSagaGauge(d *sagadef.Definition, cfg telemetry.GaugeConfig) (sagaGauge, error) {
	if d == nil || d.Name == "" || len(d.States) == 0 {
		return sagaGauge{}, errors.New("definition is nil, unnamed or not compiled")
	}
	if d.Table == "" {
		return sagaGauge{}, fmt.Errorf("definition %s has no table", d.Name)
	}
	g := sagaGauge{def: d, stuck: NewStuckRule(d, cfg.StuckGrace)}
	for _, s := range d.States {
		if s.Kind == sagadef.StateKindTerminal && !cfg.IncludeTerminal {
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
