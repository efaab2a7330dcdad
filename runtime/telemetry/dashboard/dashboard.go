// Package dashboard builds Grafana dashboards for the metrics package
// telemetry exports, from saga definitions. It imports only sagadef, so the
// generator can render a dashboard per saga without pulling in OpenTelemetry.
package dashboard

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/protosaga/saga/runtime/sagadef"
)

// Options configure [Build].
type Options struct {
	// Title defaults to "Sagas".
	Title string
	// UID defaults to a hash of the title and saga type names, so the same
	// contracts always produce the same dashboard.
	UID string
}

// Build returns a Grafana dashboard (JSON model, schema version 39) for
// the metrics the runtime exports through the Prometheus exporter: a
// runtime row (outbox backlog and age, relay publishes by outcome, consumer
// outcomes, retries by reason, parked messages, process duration,
// reconnects) and one row per saga type (instances by state, stuck
// instances, transitions by result, step latency per step of the contract,
// timeouts, compensations and manual reviews). Definitions are sorted by
// name and the output is byte-for-byte deterministic. The Prometheus data
// source is a dashboard variable ("datasource"), chosen at import.
func Build(defs []*sagadef.Definition, opts Options) ([]byte, error) {
	sorted := slices.Clone(defs)
	for _, d := range sorted {
		if d == nil || d.Name == "" {
			return nil, errors.New("grafana dashboard: nil or unnamed definition")
		}
	}
	slices.SortFunc(sorted, func(a, b *sagadef.Definition) int { return cmp.Compare(a.Name, b.Name) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Name == sorted[i-1].Name {
			return nil, fmt.Errorf("grafana dashboard: saga type %s given twice", sorted[i].Name)
		}
	}
	if opts.Title == "" {
		opts.Title = "Sagas"
	}
	if opts.UID == "" {
		h := sha256.New()
		h.Write([]byte(opts.Title))
		for _, d := range sorted {
			h.Write([]byte{0})
			h.Write([]byte(d.Name))
		}
		opts.UID = "saga-" + hex.EncodeToString(h.Sum(nil))[:16]
	}

	b := &dashBuilder{}
	b.row("Runtime")
	b.panel("Outbox backlog", "Unpublished outbox rows.", "short",
		target{"sum(saga_outbox_backlog)", "backlog"})
	b.panel("Oldest unpublished outbox row", "Age of the oldest unpublished outbox row: an accepted request that stopped moving.", "s",
		target{"max(saga_outbox_oldest_age_seconds)", "age"})
	b.panel("Relay publishes", "Outbox rows published per second; error_type is empty when confirmed (nacked, returned, confirm_timeout, ...).", "ops",
		target{`sum by (messaging_destination_name, error_type) (rate(messaging_client_sent_messages_total[$__rate_interval]))`, "{{messaging_destination_name}} {{error_type}}"})
	b.panel("Consumer outcomes", "Deliveries settled per second by queue and outcome (processed, duplicate, retry, park).", "ops",
		target{`sum by (messaging_destination_name, saga_consumer_outcome) (rate(saga_consumer_messages_total[$__rate_interval]))`, "{{messaging_destination_name}} {{saga_consumer_outcome}}"})
	b.panel("Retries by reason", "Deliveries sent to a retry tier per second.", "ops",
		target{`sum by (messaging_destination_name, saga_retry_reason) (rate(saga_consumer_retries_total[$__rate_interval]))`, "{{messaging_destination_name}} {{saga_retry_reason}}"})
	b.panel("Parked messages", "Parked messages not replayed, by original queue.", "short",
		target{`sum by (messaging_destination_name) (saga_parked_messages)`, "{{messaging_destination_name}}"})
	b.panel("Process duration p95", "From a delivery's receipt to its acknowledgement.", "s",
		target{`histogram_quantile(0.95, sum by (le, messaging_destination_name) (rate(messaging_process_duration_seconds_bucket[$__rate_interval])))`, "{{messaging_destination_name}}"})
	b.panel("Reconnects", "Broker connections re-established, consumer sessions restarted, relay LISTEN connections lost, and outbox rows released from relays found gone (a process died holding them).", "short",
		target{`sum by (saga_connection_name) (increase(saga_broker_reconnects_total[$__rate_interval]))`, "broker {{saga_connection_name}}"},
		target{`sum by (messaging_consumer_group_name) (increase(saga_consumer_reconnects_total[$__rate_interval]))`, "consumer {{messaging_consumer_group_name}}"},
		target{`sum(increase(saga_outbox_listen_reconnects_total[$__rate_interval]))`, "relay LISTEN"},
		target{`sum(increase(saga_outbox_gone_relay_rows_total[$__rate_interval]))`, "rows of gone relays"})

	for _, d := range sorted {
		sel := "saga_type=" + strconv.Quote(d.Name)
		b.row("Saga " + d.Name)
		b.panel("Instances by state", "Live instances per state (terminal states are not counted by default).", "short",
			target{"sum by (saga_state) (saga_instances{" + sel + "})", "{{saga_state}}"})
		b.panel("Stuck instances", "Instances without progress beyond their step's timeout plus grace.", "short",
			target{"sum by (saga_state) (saga_instances_stuck{" + sel + "})", "{{saga_state}}"})
		b.panel("Transitions by result", "Triggers per second: applied, duplicate, late, conflicting, invalid, early.", "ops",
			target{"sum by (saga_result) (rate(saga_transitions_total{" + sel + "}[$__rate_interval]))", "{{saga_result}}"})
		var latency []target
		for _, s := range d.Steps {
			latency = append(latency, target{
				"histogram_quantile(0.95, sum by (le) (rate(saga_step_round_trip_seconds_bucket{" + sel + ",saga_step=" + strconv.Quote(s.Name) +
					",saga_step_phase=\"forward\"}[$__rate_interval])))",
				s.Name + " p95",
			})
		}
		latency = append(latency, target{
			"histogram_quantile(0.95, sum by (le, saga_step) (rate(saga_step_round_trip_seconds_bucket{" + sel +
				",saga_step_phase=\"compensation\"}[$__rate_interval])))",
			"compensate {{saga_step}} p95",
		})
		b.panel("Step round trip", "Each step's round trip, p95: its command written to the outbox → its reply applied (and the same for compensations).", "s", latency...)
		b.panel("Step latency", "The orchestrator's part of a step, p95: a reply taken from the broker → the next command written, by the step of that command.", "s",
			target{"histogram_quantile(0.95, sum by (le, saga_step) (rate(saga_step_latency_seconds_bucket{" + sel + "}[$__rate_interval])))", "{{saga_step}} p95"})
		b.panel("Timeouts", "Step timeouts and saga deadlines fired per second, by step.", "ops",
			target{"sum by (saga_step, saga_timeout_kind) (rate(saga_timeouts_total{" + sel + "}[$__rate_interval]))", "{{saga_step}} {{saga_timeout_kind}}"})
		b.panel("Compensations and manual reviews", "Compensating commands sent and instances sent to manual review, per second.", "ops",
			target{"sum by (saga_step) (rate(saga_compensations_total{" + sel + "}[$__rate_interval]))", "compensate {{saga_step}}"},
			target{"sum(rate(saga_manual_reviews_total{" + sel + "}[$__rate_interval]))", "manual review"})
	}

	dash := map[string]any{
		"annotations":   map[string]any{"list": []any{}},
		"editable":      true,
		"graphTooltip":  1,
		"panels":        b.panels,
		"refresh":       "30s",
		"schemaVersion": 39,
		"tags":          []string{"saga", "protosaga"},
		"templating": map[string]any{"list": []any{map[string]any{
			"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
			"current": map[string]any{}, "hide": 0, "refresh": 1,
		}}},
		"time":       map[string]any{"from": "now-1h", "to": "now"},
		"timepicker": map[string]any{},
		"timezone":   "",
		"title":      opts.Title,
		"uid":        opts.UID,
		"version":    1,
	}
	out, err := json.MarshalIndent(dash, "", "  ") // maps marshal with sorted keys
	if err != nil {
		return nil, fmt.Errorf("grafana dashboard: %w", err)
	}
	return append(out, '\n'), nil
}

type target struct{ expr, legend string }

// dashBuilder lays panels out three to a row, 8 units high.
type dashBuilder struct {
	panels []any
	y, x   int
	id     int
}

func (b *dashBuilder) row(title string) {
	if b.x > 0 {
		b.y += 8
		b.x = 0
	}
	b.id++
	b.panels = append(b.panels, map[string]any{
		"id": b.id, "type": "row", "title": title, "collapsed": false, "panels": []any{},
		"gridPos": map[string]int{"h": 1, "w": 24, "x": 0, "y": b.y},
	})
	b.y++
}

func (b *dashBuilder) panel(title, description, unit string, targets ...target) {
	ds := map[string]string{"type": "prometheus", "uid": "${datasource}"}
	ts := make([]any, len(targets))
	for i, t := range targets {
		ts[i] = map[string]any{"refId": string(rune('A' + i%26)), "expr": t.expr, "legendFormat": t.legend, "datasource": ds}
	}
	b.id++
	b.panels = append(b.panels, map[string]any{
		"id": b.id, "type": "timeseries", "title": title, "description": description, "datasource": ds,
		"gridPos":     map[string]int{"h": 8, "w": 8, "x": b.x, "y": b.y},
		"fieldConfig": map[string]any{"defaults": map[string]any{"unit": unit}, "overrides": []any{}},
		"options":     map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom"}},
		"targets":     ts,
	})
	b.x += 8
	if b.x >= 24 {
		b.x = 0
		b.y += 8
	}
}
