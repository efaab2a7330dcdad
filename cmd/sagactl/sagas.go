package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/protosaga/saga/internal/termtext"
	"github.com/protosaga/saga/runtime/admin"
	"github.com/protosaga/saga/runtime/sagadef"
)

// sagaFilterFlags are the filter flags of sagas list and bulk repairs.
type sagaFilterFlags struct {
	typ, state, key, prefix string
	stuck, review           bool
	createdAfter            timeFlag
	createdBefore           timeFlag
}

func (f *sagaFilterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.typ, "type", "", "saga type (full name, e.g. shop.order.v1.PlaceOrder)")
	fs.StringVar(&f.state, "state", "", "state name, e.g. RESERVE_INVENTORY")
	fs.StringVar(&f.key, "key", "", "business key")
	fs.StringVar(&f.prefix, "prefix", "", "business keys starting with this")
	fs.BoolVar(&f.stuck, "stuck", false, "only stuck sagas: timeout or deadline overdue, or no progress beyond the step's timeout (plus the server's grace)")
	fs.BoolVar(&f.review, "review", false, "only sagas in manual review")
	fs.Var(&f.createdAfter, "created-after", "only sagas created after this time (RFC 3339) or this long ago (Go duration: 2h)")
	fs.Var(&f.createdBefore, "created-before", "only sagas created before this time (RFC 3339) or this long ago (Go duration: 2h)")
}

func (f *sagaFilterFlags) filter() admin.SagaFilter {
	return admin.SagaFilter{Type: f.typ, State: f.state, BusinessKey: f.key, KeyPrefix: f.prefix, Stuck: f.stuck, Review: f.review,
		CreatedAfter: f.createdAfter.t, CreatedBefore: f.createdBefore.t}
}

func (f *sagaFilterFlags) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"type": f.typ, "state": f.state, "business_key": f.key, "key_prefix": f.prefix} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.stuck {
		q.Set("stuck", "true")
	}
	if f.review {
		q.Set("review", "true")
	}
	for k, v := range map[string]*time.Time{"created_after": f.createdAfter.t, "created_before": f.createdBefore.t} {
		if v != nil {
			q.Set(k, v.UTC().Format(time.RFC3339Nano))
		}
	}
	return q
}

// timeFlag is a point in time given as RFC 3339 or as a duration before
// now ("2h": two hours ago).
type timeFlag struct{ t *time.Time }

func (f *timeFlag) String() string {
	if f.t == nil {
		return ""
	}
	return f.t.Format(time.RFC3339)
}

func (f *timeFlag) Set(v string) error {
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return fmt.Errorf("%q: a duration before now must be positive", v)
		}
		t := time.Now().Add(-d)
		f.t = &t
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return fmt.Errorf("%q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration before now (2h)", v)
	}
	f.t = &t
	return nil
}

func sagasCommand(ctx context.Context, env *cliEnv, sub string, args []string) error {
	switch sub {
	case "list":
		return sagasList(ctx, env, args)
	case "show":
		return sagasShow(ctx, env, args)
	case admin.ActionRetry, admin.ActionCompensate, admin.ActionCancel, admin.ActionResolve:
		return sagasRepair(ctx, env, sub, args)
	}
	return usagef("unknown subcommand %q (want list, show, retry, compensate, cancel or resolve)", sub)
}

func newFlagSet(name string, env *cliEnv) *flag.FlagSet {
	fs := flag.NewFlagSet("sagactl "+name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	return fs
}

func sagasList(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("sagas list", env)
	var c common
	var f sagaFilterFlags
	c.register(fs)
	f.register(fs)
	limit := fs.Int("limit", admin.DefaultPageSize, "page size (1-200)")
	all := fs.Bool("all", false, "follow pages until the end")
	oldest := fs.Bool("oldest", false, "oldest first (default: newest first)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	q := f.query()
	q.Set("limit", strconv.Itoa(*limit))
	if *oldest {
		q.Set("sort", admin.SortOldest)
	}
	items, next, printed, err := listPages(ctx, cl, env, c.json, *all, "api/sagas", q,
		func(p admin.SagaPage) ([]admin.Saga, string) { return p.Items, p.NextCursor })
	if err != nil || printed {
		return err
	}
	if c.json {
		return writeJSON(env.stdout, admin.SagaPage{Items: items})
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "ID\tTYPE\tBUSINESS KEY\tSTATE\tVERSION\tUPDATED\tATTENTION")
	for _, s := range items {
		printf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, short(s.Type), s.BusinessKey, s.State, s.Version,
			stamp(s.UpdatedAt), attention(s))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		printf(env.stdout, "more: --all, or the next page with the API cursor %s\n", next)
	} else {
		printf(env.stdout, "%d saga(s)\n", len(items))
	}
	return nil
}

// attention is the one thing an operator should notice about s.
func attention(s admin.Saga) string {
	switch {
	case s.Stuck:
		return "STUCK: " + s.StuckReason
	case s.ReviewReason != "":
		return "REVIEW: " + s.ReviewReason
	case s.LastError != "":
		return "last error: " + s.LastError
	}
	return ""
}

func sagasShow(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("sagas show", env)
	var c common
	c.register(fs)
	typ := fs.String("type", "", "saga type (optional; looked up otherwise)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one saga ID")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	q := url.Values{}
	if *typ != "" {
		q.Set("type", *typ)
	}
	var tl admin.Timeline
	raw, err := cl.call(ctx, http.MethodGet, "api/sagas/"+url.PathEscape(pos[0]), q, nil, &tl)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	return printTimeline(env.stdout, tl)
}

func printTimeline(w io.Writer, tl admin.Timeline) error {
	s, p := tl.Saga, tl.Position
	printf(w, "saga      %s\ntype      %s\nkey       %s\nstate     %s (%s), version %d, attempt %d\n",
		s.ID, s.Type, s.BusinessKey, s.State, s.StateKind, s.Version, s.Attempt)
	printf(w, "created   %s, updated %s\n", stamp(s.CreatedAt), stamp(s.UpdatedAt))
	if a := attention(s); a != "" {
		printf(w, "attention %s\n", a)
	}
	printf(w, "\nwhere     %s\n", p.Summary)
	var states []string
	for _, st := range tl.States {
		switch {
		case st.Current:
			states = append(states, "["+st.Name+"]")
		case st.Visited:
			states = append(states, st.Name+"*")
		default:
			states = append(states, st.Name)
		}
	}
	printf(w, "states    %s   ([current], *visited)\n", strings.Join(states, " "))
	// An ended saga has no next step: what the table lists from a terminal
	// state is what a late or conflicting message would do to it.
	first := "next"
	if s.StateKind == sagadef.StateKindTerminal.String() {
		first = "if late"
	}
	for i, n := range p.Next {
		label := first
		if i > 0 {
			label = ""
		}
		emits := ""
		if len(n.Emits) > 0 {
			emits = " (sends " + strings.Join(shorts(n.Emits), ", ") + ")"
		}
		trigger := n.Trigger
		if strings.Count(trigger, ".") > 1 { // a message full name, not a trigger kind
			trigger = short(trigger)
		}
		printf(w, "%-9s %s → %s%s\n", label, trigger, n.To, emits)
	}
	var offered []string
	for _, a := range tl.Actions {
		if a.Allowed {
			name := a.Action
			if a.To != "" {
				name += " --to " + a.To
			}
			offered = append(offered, name)
		}
	}
	if len(offered) == 0 {
		offered = []string{"none in this state"}
	}
	printf(w, "repairs   %s\n", strings.Join(offered, "; "))
	if tl.Data != nil {
		if len(tl.Data.JSON) > 0 {
			printf(w, "data      %s\n", compact(tl.Data.JSON))
		} else {
			printf(w, "data      (%s)\n", tl.Data.Note)
		}
	}
	c := tl.Counts
	printf(w, "\ntimeline: %d transitions, %d sent, %d received, %d retries, %d parked\n",
		c.Transitions, c.MessagesOut, c.MessagesIn, c.Retries, c.Parked)
	if tl.Truncated {
		fmt.Fprintln(w, "CUT: the saga has more than 1000 transitions, sent messages or parked messages; only the newest 1000 of each are shown")
	}
	tw := table(w)
	fmt.Fprintln(tw, "TIME\tKIND\tWHAT\tCAUSE")
	for _, e := range tl.Events {
		kind := e.Kind
		if e.Direction != "" {
			kind += " " + e.Direction
		}
		printf(tw, "%s\t%s\t%s\t%s\n", stamp(e.At), kind, e.Summary, cause(e))
	}
	return tw.Flush()
}

// cause names what caused an event: message and causation ids, operator.
func cause(e admin.Event) string {
	var parts []string
	switch e.Kind {
	case admin.EventTransition:
		if e.MessageID != "" {
			parts = append(parts, "message "+e.MessageID)
		}
		if e.CausationID != "" {
			parts = append(parts, "causation "+e.CausationID)
		}
		if e.Operator != "" {
			parts = append(parts, "operator "+e.Operator)
		}
	case admin.EventMessage:
		parts = append(parts, "message "+e.MessageID)
		if e.ReceivedAt != nil {
			parts = append(parts, "applied "+stamp(*e.ReceivedAt))
		}
		if e.Body != nil && len(e.Body.JSON) > 0 {
			parts = append(parts, compact(e.Body.JSON))
		}
	case admin.EventParked:
		parts = append(parts, fmt.Sprintf("parked #%d", e.ParkedID))
		switch {
		case e.ReplayedBy != "":
			parts = append(parts, "replayed by "+e.ReplayedBy)
		case e.DismissedBy != "":
			parts = append(parts, "dismissed by "+e.DismissedBy)
		case e.Standing != "":
			parts = append(parts, strings.ToUpper(e.Standing))
		}
	}
	return strings.Join(parts, ", ")
}

func sagasRepair(ctx context.Context, env *cliEnv, action string, args []string) error {
	fs := newFlagSet("sagas "+action, env)
	var c common
	var f sagaFilterFlags
	c.register(fs)
	f.register(fs)
	reason := fs.String("reason", "", "why (required; recorded in the audit trail)")
	to := fs.String("to", "", "resolve: the state to end in (COMPLETED, FAILED or CANCELLED)")
	version := fs.Int64("version", 0, "the version you decided on (default: the saga's current version)")
	dryRun := fs.Bool("dry-run", false, "bulk: list what would happen, change nothing")
	maxN := fs.Int("max", 0, fmt.Sprintf("bulk: act on at most this many sagas (default %d, at most %d)", admin.DefaultBulk, admin.MaxBulk))
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required: every repair records why")
	}
	switch {
	case action == admin.ActionResolve && *to == "":
		return usagef("resolve needs --to COMPLETED, FAILED or CANCELLED")
	case action != admin.ActionResolve && *to != "":
		return usagef("--to is only for resolve")
	case *version < 0:
		return usagef("--version %d: want the positive version you decided on (or none: the saga's current one)", *version)
	}
	filter := f.filter()
	bulk := len(pos) == 0
	switch {
	case len(pos) > 1:
		return usagef("want one saga ID (or none, with filter flags, for a bulk repair)")
	case bulk && filter == (admin.SagaFilter{}):
		return usagef("want a saga ID, or filter flags (--type, --state, --key, --prefix, --stuck, --review, --created-after, --created-before) for a bulk repair")
	case !bulk && filter != (admin.SagaFilter{}) && filter != (admin.SagaFilter{Type: f.typ}):
		return usagef("give a saga ID or filter flags, not both")
	case !bulk && (*dryRun || *maxN != 0):
		return usagef("--dry-run and --max are for bulk repairs (no saga ID)")
	case bulk && *version != 0:
		return usagef("--version is for one saga; a bulk repair uses each saga's version as listed")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()

	if bulk {
		var res admin.BulkResult
		raw, err := cl.call(ctx, http.MethodPost, "api/bulk/sagas/"+action, nil,
			admin.BulkRequest{Filter: filter, Reason: *reason, To: *to, DryRun: *dryRun, Max: *maxN}, &res)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(env.stdout, raw)
		}
		tw := table(env.stdout)
		fmt.Fprintln(tw, "SAGA\tTYPE\tBUSINESS KEY\tSTATE\tVERSION\tOUTCOME\tTO\tSENDS\tERROR")
		for _, it := range res.Items {
			printf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", it.SagaID, short(it.Type), it.BusinessKey, it.State, it.Version, it.Outcome, it.To,
				strings.Join(it.Sends, ", "), it.Error)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printf(env.stdout, "%s %s: %s", action, map[bool]string{true: "dry run", false: "done"}[res.DryRun], counts(res.Counts))
		if res.Truncated {
			fmt.Fprint(env.stdout, " (more sagas match: raise --max or run again)")
		}
		fmt.Fprintln(env.stdout)
		return nil
	}

	id := pos[0]
	if *version == 0 {
		var tl admin.Timeline
		q := url.Values{}
		if f.typ != "" {
			q.Set("type", f.typ)
		}
		if _, err := cl.call(ctx, http.MethodGet, "api/sagas/"+url.PathEscape(id), q, nil, &tl); err != nil {
			return err
		}
		*version = tl.Saga.Version
		printf(env.stderr, "deciding on version %d (state %s)\n", tl.Saga.Version, tl.Saga.State)
	}
	var res admin.ActionResult
	raw, err := cl.call(ctx, http.MethodPost, "api/sagas/"+url.PathEscape(id)+"/"+action, nil,
		admin.ActionRequest{ExpectedVersion: *version, Reason: *reason, To: *to, Type: f.typ}, &res)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	printf(env.stdout, "%s %s: saga %s is %s (version %d)\n", action, strings.ReplaceAll(res.Outcome, "_", " "), res.Saga.ID, res.Saga.State, res.Saga.Version)
	return nil
}

// counts renders outcome counts in a stable order.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "nothing matched"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// printf is fmt.Fprintf for human output. Every string argument is
// escaped first (termtext.Escape): most hold text from elsewhere (business
// keys, handlers' errors, operators' reasons) whose control characters a
// terminal would act on, or whose tabs and line breaks would forge table
// cells and rows. Only the format lays out the output.
func printf(w io.Writer, format string, args ...any) {
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = termtext.Escape(s)
		}
	}
	fmt.Fprintf(w, format, args...)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func short(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[i+1:]
	}
	return full
}

func shorts(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = short(n)
	}
	return out
}

func compact(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func writeJSON(w io.Writer, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return printJSON(w, raw)
}
