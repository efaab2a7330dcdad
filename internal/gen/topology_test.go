package gen_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/gen/protoc"
)

// TestExchangeKinds checks the kind the generated topology gives each
// exchange: direct where only commands and replies go (each bound by its
// exact routing key to one queue), topic where an event goes, also when the
// event shares its exchange with commands.
func TestExchangeKinds(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, dir := range []string{"kinds/v1", "audit/v1"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, dir), 0o755))
	}
	// An event in an imported file that is not generated in this request
	// still makes the exchange it shares with a generated command topic.
	imported := `syntax = "proto3";
package audit.v1;
import "saga/v1/saga.proto";
option go_package = "example.com/audit/v1;auditv1";

message Audited {
  option (saga.v1.message) = {kind: KIND_EVENT, correlation_field: "id", exchange: "kinds.audit"};
  string id = 1;
}
`
	require.NoError(t, os.WriteFile(filepath.Join(root, "audit", "v1", "audit.proto"), []byte(imported), 0o644))
	src := `syntax = "proto3";
package kinds.v1;
import "saga/v1/saga.proto";
import "audit/v1/audit.proto";
option go_package = "example.com/kinds/v1;kindsv1";

message Audit {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", idempotency_key: ["id"], exchange: "kinds.audit"};
  audit.v1.Audited subject = 1;
  string id = 2;
}

message Reserve {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", idempotency_key: ["id"]};
  string id = 1;
}
message Reserved {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "id", answers: "Reserve"};
  string id = 1;
}
message Restock {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", idempotency_key: ["id"], exchange: "kinds.shared"};
  string id = 1;
}
message Restocked {
  option (saga.v1.message) = {kind: KIND_EVENT, correlation_field: "id", exchange: "kinds.shared"};
  string id = 1;
}
message Counted {
  option (saga.v1.message) = {kind: KIND_EVENT, correlation_field: "id"};
  string id = 1;
}
`
	require.NoError(t, os.WriteFile(filepath.Join(root, "kinds", "v1", "kinds.proto"), []byte(src), 0o644))
	_, resp := outcome(compile(t, root, "paths=source_relative", "kinds/v1/kinds.proto"))
	require.Nil(t, resp.Error, resp.GetError())
	js, ok := protoc.Files(resp)["kinds/v1/topology.saga.json"]
	require.True(t, ok, "no topology.saga.json generated")
	var defs struct {
		Exchanges []struct{ Name, Type string } `json:"exchanges"`
	}
	require.NoError(t, json.Unmarshal(js, &defs))
	got := map[string]string{}
	for _, e := range defs.Exchanges {
		got[e.Name] = e.Type
	}
	require.Equal(t, map[string]string{
		"kinds.v1.commands": "direct", // Reserve
		"kinds.v1.replies":  "direct", // Reserved
		"kinds.shared":      "topic",  // Restock and the event Restocked
		"kinds.v1.events":   "topic",  // Counted
		"kinds.audit":       "topic",  // Audit, and the imported event Audited
	}, got)
	require.NotContains(t, protoc.Files(resp), "audit/v1/topology.saga.json", "the imported file is not generated")

	code := string(protoc.Files(resp)["kinds/v1/kinds.saga.go"])
	require.Contains(t, code, `{Name: "kinds.v1.commands", Kind: "direct"}`)
	require.Contains(t, code, `{Name: "kinds.shared", Kind: "topic"}`)
}

// TestSagaQueueBindsStart: a saga's queue is bound to its start message
// (an event, or a command, which has no owner: rule saga-start), since the
// engine starts an instance from a start message delivered on its queue.
func TestSagaQueueBindsStart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bind", "v1"), 0o755))
	src := `syntax = "proto3";
package bind.v1;
import "saga/v1/saga.proto";
option go_package = "example.com/bind/v1;bindv1";

` + events("Opened", "Approved", "Signed") + `
message Open {
  option (saga.v1.message) = {kind: KIND_COMMAND, idempotency_key: ["id"]};
  string id = 1;
}
message ByEventData {
  option (saga.v1.saga) = {start: "Opened", business_key: "id", steps: {role: ROLE_PIVOT, external: true, success: "Approved", timeout: "1h", late_reply: LATE_REPLY_IGNORE}};
  string id = 1;
}
message ByCommandData {
  option (saga.v1.saga) = {start: "Open", business_key: "id", steps: {role: ROLE_PIVOT, external: true, success: "Signed", timeout: "1h", late_reply: LATE_REPLY_IGNORE}};
  string id = 1;
}
`
	require.NoError(t, os.WriteFile(filepath.Join(root, "bind", "v1", "bind.proto"), []byte(src), 0o644))
	_, resp := outcome(compile(t, root, "paths=source_relative", "bind/v1/bind.proto"))
	require.Nil(t, resp.Error, resp.GetError())
	var defs struct {
		Bindings []struct {
			Destination string `json:"destination"`
			RoutingKey  string `json:"routing_key"`
		} `json:"bindings"`
	}
	require.NoError(t, json.Unmarshal(protoc.Files(resp)["bind/v1/topology.saga.json"], &defs))
	queues := map[string][]string{} // routing key → queues
	for _, b := range defs.Bindings {
		queues[b.RoutingKey] = append(queues[b.RoutingKey], b.Destination)
	}
	require.Equal(t, []string{"by_event.saga.by_event"}, queues["event.bind.v1.opened"])
	require.Equal(t, []string{"by_command.saga.by_command"}, queues["command.bind.v1.open"])
}

// events declares an annotated event message with a string field id for
// each name, for contracts written by tests.
func events(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "message %s {\n  option (saga.v1.message) = {kind: KIND_EVENT, correlation_field: \"id\"};\n  string id = 1;\n}\n", n)
	}
	return b.String()
}
