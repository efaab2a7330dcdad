// Package synth writes synthetic saga contracts of any size, for the
// generator's benchmarks (internal/gen and bench/) and for tests that need a
// large valid input.
package synth

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MessagesPerSaga is how many annotated messages each synthetic file holds
// (commands, replies and the start message); each file also has one saga data
// message.
const MessagesPerSaga = 14

// Write writes n proto files under root, each a package with one saga of four
// steps (a compensatable step, a pivot, two retriable steps), and returns
// their paths relative to root. The contracts import "saga/v1/saga.proto", so
// the options directory must be on the import path.
func Write(root string, n int) ([]string, error) {
	var files []string
	for i := range n {
		name := fmt.Sprintf("s%03d/flow.proto", i)
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			return nil, fmt.Errorf("synthetic contract %d: %w", i, err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(contract(i)), 0o644); err != nil {
			return nil, fmt.Errorf("synthetic contract %d: %w", i, err)
		}
		files = append(files, name)
	}
	return files, nil
}

// contract returns the source of synthetic file i.
func contract(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "syntax = \"proto3\";\npackage synth.s%03d.v1;\nimport \"saga/v1/saga.proto\";\n", i)
	fmt.Fprintf(&b, "option go_package = \"example.com/synth/s%03d/v1;s%03dv1\";\n", i, i)
	msg := func(name, opt string) {
		fmt.Fprintf(&b, "message %s {\n  option (saga.v1.message) = {%s};\n  string id = 1;\n  int64 amount = 2;\n  repeated string tags = 3;\n}\n", name, opt)
	}
	// One owner per file: a service owns commands in one Go package.
	cmd := func(name string) {
		msg(name, fmt.Sprintf(`kind: KIND_COMMAND, owner: "svc%03d", idempotency_key: ["id"], correlation_field: "id"`, i))
	}
	reply := func(name string) { msg(name, `kind: KIND_REPLY, correlation_field: "id"`) }
	msg("Begin", `kind: KIND_COMMAND, idempotency_key: ["id"]`)
	for _, s := range []string{"Reserve", "Charge", "Ship", "Notify"} {
		cmd(s)
		reply(s + "Done")
	}
	reply("ReserveFailed")
	reply("ChargeFailed")
	cmd("Release")
	reply("Released")
	step := func(name, role, extra string) string {
		return fmt.Sprintf(`steps: {role: %s command: %q success: "%sDone" timeout: "10s" late_reply: LATE_REPLY_IGNORE %s}`, role, name, name, extra)
	}
	fmt.Fprintf(&b, "message FlowData {\n  option (saga.v1.saga) = {name: \"Flow%03d\" start: \"Begin\" business_key: \"id\" service: \"svc\" deadline: \"1h\"\n%s\n%s\n%s\n%s\n};\n  string id = 1;\n}\n", i,
		step("Reserve", "ROLE_COMPENSATABLE", `failure: "ReserveFailed" compensation: "Release" compensation_reply: "Released"`),
		step("Charge", "ROLE_PIVOT", `failure: "ChargeFailed" on_timeout: TIMEOUT_ACTION_MANUAL_REVIEW`),
		step("Ship", "ROLE_RETRIABLE", `max_attempts: 3`),
		step("Notify", "ROLE_RETRIABLE", `max_attempts: 3`))
	return b.String()
}
