package dashboard_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
	"github.com/protosaga/saga/runtime/telemetry/dashboard"
)

func TestDashboardDeterministicAndComplete(t *testing.T) {
	t.Parallel()
	order := &sagadef.Definition{Name: "tel.v1.Order", Steps: []sagadef.Step{{Name: "Reserve"}, {Name: "Charge"}}}
	other := &sagadef.Definition{Name: "tel.v1.Another", Steps: []sagadef.Step{{Name: "Only"}}}

	a, err := dashboard.Build([]*sagadef.Definition{order, other}, dashboard.Options{})
	require.NoError(t, err)
	b, err := dashboard.Build([]*sagadef.Definition{other, order}, dashboard.Options{})
	require.NoError(t, err)
	require.Equal(t, string(a), string(b), "input order must not matter")

	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(a, &dash))
	require.Equal(t, "Sagas", dash.Title)
	require.Regexp(t, `^saga-[0-9a-f]{16}$`, dash.UID)

	var rows []string
	var legends []string
	ids := map[int]bool{}
	used := map[string]bool{}
	metricRef := regexp.MustCompile(`\b(?:saga|messaging)_[a-z_]+`)
	for _, p := range dash.Panels {
		require.False(t, ids[p.ID], "duplicate panel id %d", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			rows = append(rows, p.Title)
		}
		for _, tg := range p.Targets {
			legends = append(legends, tg.Legend)
			if strings.Contains(tg.Expr, "saga_step_round_trip") {
				require.Contains(t, tg.Expr, "saga_step_phase=", "a step's round trip and its compensation's are told apart")
			}
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				if !strings.HasPrefix(m, "saga_type") && !strings.HasPrefix(m, "saga_step") && !strings.HasPrefix(m, "saga_state") &&
					!strings.HasPrefix(m, "saga_result") && !strings.HasPrefix(m, "saga_timeout_kind") && !strings.HasPrefix(m, "saga_consumer_outcome") &&
					!strings.HasPrefix(m, "saga_retry_reason") && !strings.HasPrefix(m, "saga_connection_name") && !strings.HasPrefix(m, "messaging_destination_name") && !strings.HasPrefix(m, "messaging_consumer_group_name") {
					used[m] = true
				}
			}
		}
	}
	require.Equal(t, []string{"Runtime", "Saga tel.v1.Another", "Saga tel.v1.Order"}, rows)
	require.Contains(t, legends, "Reserve p95", "the step round trip has one query per step of the contract")
	require.Contains(t, legends, "Charge p95")
	require.Contains(t, legends, "Only p95")
	require.Contains(t, legends, "compensate {{saga_step}} p95")

	// Every metric the dashboard queries is one the runtime exports, in
	// the Prometheus exporter's naming.
	exported := map[string]bool{}
	for _, name := range []string{
		telemetry.MetricTransitions, telemetry.MetricStepLatency, telemetry.MetricStepRoundTrip, telemetry.MetricTimeouts, telemetry.MetricCompensations,
		telemetry.MetricManualReviews, telemetry.MetricConsumed, telemetry.MetricProcessDuration, telemetry.MetricConsumerMessages,
		telemetry.MetricConsumerRetries, telemetry.MetricConsumerParked, telemetry.MetricConsumerRestarts, telemetry.MetricSent,
		telemetry.MetricPublishDelay, telemetry.MetricListenReconnects, telemetry.MetricGoneRelayRows, broker.MetricReconnects, telemetry.MetricInstances, telemetry.MetricStuck,
		telemetry.MetricOutboxBacklog, telemetry.MetricOutboxOldestAge, telemetry.MetricParkedMessages,
	} {
		exported[strings.ReplaceAll(name, ".", "_")] = true
	}
	var unknown []string
	for m := range used {
		base := m
		for _, suffix := range []string{"_bucket", "_total", "_seconds"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !exported[base] {
			unknown = append(unknown, m)
		}
	}
	slices.Sort(unknown)
	require.Empty(t, unknown)

	_, err = dashboard.Build([]*sagadef.Definition{order, order}, dashboard.Options{})
	require.Error(t, err)
	_, err = dashboard.Build([]*sagadef.Definition{nil}, dashboard.Options{})
	require.Error(t, err)
}
