package bufcheck_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"buf.build/go/bufplugin/check"
	"buf.build/go/bufplugin/check/checktest"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/bufcheck"
)

// breakingDir holds the contract every breaking case starts from
// (order.proto) and each case's golden (<case>.golden).
var breakingDir = filepath.Join("testdata", "breaking")

// edit turns one version of order.proto into another; it fails the test
// when it does not apply.
type edit func(t *testing.T, src string) string

// replace replaces the one occurrence of old.
func replace(old, new string) edit {
	return func(t *testing.T, src string) string {
		t.Helper()
		require.Equal(t, 1, strings.Count(src, old), "the edit's text %q occurs once", old)
		return strings.Replace(src, old, new, 1)
	}
}

// cut removes the text from the one occurrence of from up to and including
// the first occurrence of through after it.
func cut(from, through string) edit {
	return func(t *testing.T, src string) string {
		t.Helper()
		require.Equal(t, 1, strings.Count(src, from), "the edit's text %q occurs once", from)
		i := strings.Index(src, from)
		j := strings.Index(src[i:], through)
		require.GreaterOrEqual(t, j, 0, "no %q after %q", through, from)
		return src[:i] + src[i+j+len(through):]
	}
}

// step returns the text of the step named name in src.
func step(t *testing.T, src, name string) string {
	t.Helper()
	i := strings.Index(src, "    steps: {\n      name: \""+name+"\"")
	require.GreaterOrEqual(t, i, 0, "no step %s", name)
	j := strings.Index(src[i:], "\n    }\n")
	return src[i : i+j+len("\n    }\n")]
}

// swapSteps exchanges the steps named a and b (a before b).
func swapSteps(a, b string) edit {
	return func(t *testing.T, src string) string {
		t.Helper()
		sa, sb := step(t, src, a), step(t, src, b)
		return strings.Replace(src, sa+sb, sb+sa, 1)
	}
}

// message appends a message declaration to the file.
func message(decl string) edit {
	return func(t *testing.T, src string) string { return src + "\n" + decl + "\n" }
}

// breakingCase is a pair of contract versions: order.proto with before
// applied, and with after applied.
type breakingCase struct {
	name          string
	before, after []edit
}

var breakingCases = []breakingCase{
	{name: "saga_no_delete", after: []edit{cut("  option (saga.v1.saga) = {", "  };\n")}},
	{name: "saga_same_name", after: []edit{replace(`name: "PlaceOrder"`, `name: "Checkout"`)}},
	{name: "saga_same_service", after: []edit{replace(`service: "order"`, `service: "checkout"`)}},
	{name: "saga_same_start", after: []edit{
		replace(`start: "PlaceOrder"`, `start: "SubmitOrder"`),
		message(`message SubmitOrder {
  option (saga.v1.message) = {kind: KIND_COMMAND, idempotency_key: ["order_id"]};
  string order_id = 1;
}`),
	}},
	{name: "saga_same_business_key", after: []edit{replace(`business_key: "order_id"`, `business_key: "customer_id"`)}},
	{name: "step_no_delete", after: []edit{
		cut("    steps: {\n      name: \"ReserveStock\"", "    }\n"),
		cut("    steps: {\n      name: \"Notify\"", "    }\n"),
	}},
	{name: "step_same_name", after: []edit{replace(`name: "ReserveStock"`, `name: "HoldStock"`)}},
	{name: "step_same_order", after: []edit{swapSteps("Ship", "Notify")}},
	// The pivot becomes compensatable (it gets a refund).
	{name: "step_same_role", after: []edit{
		replace("      role: ROLE_PIVOT\n      command: \"Charge\"\n",
			"      role: ROLE_COMPENSATABLE\n      command: \"Charge\"\n      compensation: \"Refund\"\n      compensation_reply: \"Refunded\"\n"),
		message(`message Refund {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "payments", idempotency_key: ["order_id"]};
  string order_id = 1;
}
message Refunded {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "order_id"};
  string order_id = 1;
}`),
	}},
	// The point of no return moves to the first step: it stops being
	// compensatable, and the old pivot becomes retriable.
	{name: "step_same_role_pivot", after: []edit{
		replace("      role: ROLE_COMPENSATABLE\n      command: \"Reserve\"\n      success: \"Reserved\"\n      compensation: \"Release\"\n      compensation_reply: \"Released\"\n",
			"      role: ROLE_PIVOT\n      command: \"Reserve\"\n      success: \"Reserved\"\n"),
		replace("      role: ROLE_PIVOT\n      command: \"Charge\"", "      role: ROLE_RETRIABLE\n      command: \"Charge\""),
	}},
	// The pivot becomes a check: the saga has no point of no return left.
	{name: "step_same_role_check", after: []edit{
		replace("      role: ROLE_PIVOT\n      command: \"Charge\"", "      role: ROLE_CHECK\n      command: \"Charge\""),
	}},
	{name: "step_same_command", after: []edit{
		replace(`command: "Charge"`, `command: "ChargeCard"`),
		replace(`compensation: "Release"`, `compensation: "ReleaseStock"`),
		message(`message ChargeCard {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "payments", idempotency_key: ["order_id"]};
  string order_id = 1;
}
message ReleaseStock {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "stock", idempotency_key: ["order_id"]};
  string order_id = 1;
}`),
	}},
	{name: "step_same_replies", after: []edit{
		replace(`failure: "ChargeDeclined"`, `success: "ChargeDeclined"`),
		replace(`compensation_reply: "Released"`, `compensation_reply: "ReleaseConfirmed"`),
		message(`message ReleaseConfirmed {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "order_id"};
  string order_id = 1;
}`),
	}},
	// Away from manual review, and between the other policies, are
	// findings; to manual review (Notify) is not.
	{name: "step_same_late_reply", after: []edit{
		replace("      late_reply: LATE_REPLY_MANUAL_REVIEW\n", "      late_reply: LATE_REPLY_IGNORE\n"),
		replace("      command: \"Ship\"\n      success: \"Shipped\"\n      timeout: \"10s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_IGNORE\n",
			"      command: \"Ship\"\n      success: \"Shipped\"\n      timeout: \"10s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_APPLY_IF_WAITING\n"),
		replace("      command: \"Notify\"\n      success: \"Notified\"\n      timeout: \"10s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_IGNORE\n",
			"      command: \"Notify\"\n      success: \"Notified\"\n      timeout: \"10s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_MANUAL_REVIEW\n"),
	}},
	{name: "message_same_routing", after: []edit{
		replace(`{kind: KIND_COMMAND, owner: "payments", idempotency_key: ["order_id"]}`,
			`{kind: KIND_COMMAND, owner: "payments", idempotency_key: ["order_id"], routing_key: "command.payments.charge.v2"}`),
		replace("message Shipped {\n  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: \"order_id\"}",
			"message Shipped {\n  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: \"order_id\", exchange: \"shop.shipping\"}"),
	}},
	{name: "message_same_correlation", after: []edit{
		replace("message Charged {\n  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: \"order_id\"}",
			"message Charged {\n  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: \"charge_id\"}"),
	}},
	{name: "command_same_idempotency_key", after: []edit{
		replace(`{kind: KIND_COMMAND, owner: "payments", idempotency_key: ["order_id"]}`,
			`{kind: KIND_COMMAND, owner: "payments", idempotency_key: ["card_token"]}`),
	}},
	{name: "command_same_owner", after: []edit{replace(`owner: "shipping"`, `owner: "logistics"`)}},
	{name: "exchange_same_type", after: []edit{message(`message OrderShipped {
  option (saga.v1.message) = {kind: KIND_EVENT, exchange: "shop.order.v1.replies"};
  string order_id = 1;
}`)}},
	// Changes that are safe for sagas in flight: a step appended, a reply
	// added to a step, a late-reply policy changed to manual review, a key
	// field renamed (same number), a timeout changed.
	{name: "safe_changes", after: []edit{
		replace("    steps: {\n      name: \"Notify\"", `    steps: {
      name: "Archive"
      role: ROLE_RETRIABLE
      command: "Archive"
      success: "Archived"
      timeout: "10s"
      max_attempts: 3
      late_reply: LATE_REPLY_IGNORE
    }
    steps: {
      name: "Notify"`),
		replace(`success: "Shipped"`, "success: \"Shipped\"\n      success: \"ShippedLater\""),
		replace("      command: \"Notify\"\n      success: \"Notified\"\n      timeout: \"10s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_IGNORE\n",
			"      command: \"Notify\"\n      success: \"Notified\"\n      timeout: \"30s\"\n      max_attempts: 3\n      late_reply: LATE_REPLY_MANUAL_REVIEW\n"),
		replace("message Reserve {\n  option (saga.v1.message) = {kind: KIND_COMMAND, owner: \"stock\", idempotency_key: [\"order_id\"]};\n  string order_id = 1;",
			"message Reserve {\n  option (saga.v1.message) = {kind: KIND_COMMAND, owner: \"stock\", idempotency_key: [\"order_ref\"]};\n  string order_ref = 1;"),
		message(`message Archive {
  option (saga.v1.message) = {kind: KIND_COMMAND, owner: "archive", idempotency_key: ["order_id"]};
  string order_id = 1;
}
message Archived {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "order_id"};
  string order_id = 1;
}
message ShippedLater {
  option (saga.v1.message) = {kind: KIND_REPLY, correlation_field: "order_id"};
  string order_id = 1;
}`),
	}},
	// The deployed contract fails a review rule (as one may after the review
	// gained a rule): it is still compared.
	{
		name:   "against_fails_review",
		before: []edit{replace("      command: \"Ship\"\n      success: \"Shipped\"\n      timeout: \"10s\"", "      command: \"Ship\"\n      success: \"Shipped\"\n      timeout: \"ten seconds\"")},
		after:  []edit{replace(`name: "Ship"`, `name: "Dispatch"`)},
	},
}

// versions writes the case's before and after contracts into two
// directories and returns them.
func (c breakingCase) versions(t *testing.T) (before, after string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(breakingDir, "order.proto"))
	require.NoError(t, err)
	write := func(edits []edit) string {
		src := string(b)
		for _, e := range edits {
			src = e(t, src)
		}
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "order.proto"), []byte(src), 0o644))
		return dir
	}
	return write(c.before), write(c.after)
}

func breakingRuleIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, r := range bufcheck.Spec().Rules {
		if r.Type == check.RuleTypeBreaking {
			ids = append(ids, r.ID)
		}
	}
	require.NotEmpty(t, ids)
	return ids
}

// breakingLine formats an annotation as the goldens hold it:
// "file:line:col: RULE: message (against file:line:col)".
func breakingLine(t *testing.T, a check.Annotation) string {
	t.Helper()
	at := func(l interface {
		StartLine() int
		StartColumn() int
	}, file string) string {
		return fmt.Sprintf("%s:%d:%d", file, l.StartLine()+1, l.StartColumn()+1)
	}
	where := "<input>"
	if l := a.FileLocation(); l != nil {
		where = at(l, l.FileDescriptor().ProtoreflectFileDescriptor().Path())
	}
	was := a.AgainstFileLocation()
	require.NotNil(t, was, "%s has no against location", a.RuleID())
	return fmt.Sprintf("%s: %s: %s (against %s)", where, a.RuleID(), a.Message(),
		at(was, was.FileDescriptor().ProtoreflectFileDescriptor().Path()))
}

// TestBreaking runs every breaking rule on every pair of contract versions
// and compares the findings with the case's golden.
func TestBreaking(t *testing.T) {
	t.Parallel()
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	for _, c := range breakingCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			before, after := c.versions(t)
			req, err := (&checktest.RequestSpec{
				Files:        &checktest.ProtoFileSpec{DirPaths: []string{after, optionsDir}, FilePaths: []string{"order.proto"}},
				AgainstFiles: &checktest.ProtoFileSpec{DirPaths: []string{before, optionsDir}, FilePaths: []string{"order.proto"}},
				RuleIDs:      breakingRuleIDs(t),
			}).ToRequest(t.Context())
			require.NoError(t, err)
			resp, err := client.Check(t.Context(), req)
			require.NoError(t, err)
			var got strings.Builder
			for _, a := range resp.Annotations() {
				got.WriteString(breakingLine(t, a) + "\n")
			}
			golden := filepath.Join(breakingDir, c.name+".golden")
			if *update {
				require.NoError(t, os.WriteFile(golden, []byte(got.String()), 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "missing golden; run go test ./internal/bufcheck -update")
			require.Equal(t, string(want), got.String(), "golden %s differs; rerun with -update if intended", golden)
		})
	}
}

// TestBreakingUnchanged: the base contract against itself, and a request
// without against files (buf lint's), have no findings.
func TestBreakingUnchanged(t *testing.T) {
	t.Parallel()
	client, err := check.NewClientForSpec(bufcheck.Spec())
	require.NoError(t, err)
	files := &checktest.ProtoFileSpec{DirPaths: []string{breakingDir, optionsDir}, FilePaths: []string{"order.proto"}}
	for _, against := range []*checktest.ProtoFileSpec{files, nil} {
		req, err := (&checktest.RequestSpec{Files: files, AgainstFiles: against, RuleIDs: breakingRuleIDs(t)}).ToRequest(t.Context())
		require.NoError(t, err)
		resp, err := client.Check(t.Context(), req)
		require.NoError(t, err)
		require.Empty(t, resp.Annotations())
	}
}

var goldenRuleRE = regexp.MustCompile(`(?m)^\S+: (SAGA_[A-Z_]+): `)

// TestEveryBreakingRuleHasACase: every breaking rule has a case named after
// it, some case's golden has its finding, the safe changes have none, and
// the rule is documented in docs/design-review.md.
func TestEveryBreakingRuleHasACase(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "design-review.md"))
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, c := range breakingCases {
		b, err := os.ReadFile(filepath.Join(breakingDir, c.name+".golden"))
		require.NoError(t, err)
		for _, m := range goldenRuleRE.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
		if c.name == "safe_changes" {
			require.Empty(t, string(b), "safe changes have no findings")
		}
	}
	var missing []string
	for _, id := range breakingRuleIDs(t) {
		if !seen[id] {
			missing = append(missing, id+" (no case finds it)")
		}
		if !strings.Contains(string(doc), "### `"+id+"`") {
			missing = append(missing, id+" (undocumented)")
		}
		name := strings.ToLower(strings.TrimPrefix(id, "SAGA_"))
		if !slices.ContainsFunc(breakingCases, func(c breakingCase) bool { return c.name == name || c.name == "saga_"+name }) {
			missing = append(missing, id+" (no case named after it)")
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing)
}
