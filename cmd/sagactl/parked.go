package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/protosaga/saga/runtime/admin"
)

// parkedFilterFlags are the filter flags of parked list and bulk replay
// and dismissal.
type parkedFilterFlags struct {
	sagaType, saga, queue, messageType, reason string
	olderThan, newerThan                       time.Duration
}

func (f *parkedFilterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.sagaType, "saga-type", "", "saga type of the parked messages")
	fs.StringVar(&f.saga, "saga", "", "saga id (its messages parked without saga metadata included)")
	fs.StringVar(&f.queue, "queue", "", "queue the messages were parked from")
	fs.StringVar(&f.messageType, "message-type", "", "message type (full name)")
	fs.StringVar(&f.reason, "reason-has", "", "reason contains this (any case)")
	fs.DurationVar(&f.olderThan, "older-than", 0, "parked longer ago than this (Go duration: 1h)")
	fs.DurationVar(&f.newerThan, "newer-than", 0, "parked more recently than this (Go duration: 10m)")
}

func (f *parkedFilterFlags) filter() admin.ParkedFilter {
	pf := admin.ParkedFilter{SagaType: f.sagaType, SagaID: f.saga, Queue: f.queue, MessageType: f.messageType, Reason: f.reason}
	if f.olderThan > 0 {
		pf.OlderThan = f.olderThan.String()
	}
	if f.newerThan > 0 {
		pf.NewerThan = f.newerThan.String()
	}
	return pf
}

func parkedCommand(ctx context.Context, env *cliEnv, sub string, args []string) error {
	switch sub {
	case "list":
		return parkedList(ctx, env, args)
	case "show":
		return parkedShow(ctx, env, args)
	case "replay":
		return parkedReplay(ctx, env, args)
	case "dismiss":
		return parkedDismiss(ctx, env, args)
	}
	return usagef("unknown subcommand %q (want list, show, replay or dismiss)", sub)
}

func parkedList(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("parked list", env)
	var c common
	var f parkedFilterFlags
	c.register(fs)
	f.register(fs)
	replayed := fs.Bool("replayed", false, "include messages already replayed")
	limit := fs.Int("limit", admin.DefaultPageSize, "page size (1-200)")
	all := fs.Bool("all", false, "follow pages until the end")
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
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	pf := f.filter()
	for k, v := range map[string]string{"saga_type": pf.SagaType, "saga_id": pf.SagaID, "queue": pf.Queue, "message_type": pf.MessageType,
		"reason": pf.Reason, "older_than": pf.OlderThan, "newer_than": pf.NewerThan} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *replayed {
		q.Set("include_replayed", "true")
	}
	items, next, printed, err := listPages(ctx, cl, env, c.json, *all, "api/parked", q,
		func(p admin.ParkedPage) ([]admin.Parked, string) { return p.Items, p.NextCursor })
	if err != nil || printed {
		return err
	}
	if c.json {
		return writeJSON(env.stdout, admin.ParkedPage{Items: items})
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "ID\tMESSAGE\tSAGA\tBUSINESS KEY\tSTEP\tQUEUE\tCLASS\tATTEMPTS\tFIRST FAILURE\tLAST FAILURE\tSTANDING\tREASON")
	for _, p := range items {
		printf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, short(p.MessageType), p.SagaID, p.BusinessKey,
			p.Step, p.Queue, p.Class, p.Attempts, stamp(p.FirstFailureAt), stamp(p.ParkedAt), standing(p), oneLine(p.Reason, 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintln(env.stdout, "more: use --all")
	} else {
		printf(env.stdout, "%d parked message(s)\n", len(items))
	}
	return nil
}

// standing says whether a parked row is open and still applies.
func standing(p admin.Parked) string {
	switch {
	case p.ReplayedAt != nil:
		s := "replayed by " + p.ReplayedBy + " " + stamp(*p.ReplayedAt)
		if p.ReplayForced {
			s += " FORCED"
		}
		return s
	case p.DismissedAt != nil:
		return "dismissed by " + p.DismissedBy + " " + stamp(*p.DismissedAt)
	case p.Standing == admin.StandingCurrent:
		return "CURRENT"
	case p.Standing == admin.StandingSuperseded:
		return "superseded"
	}
	return "open"
}

func parkedShow(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("parked show", env)
	var c common
	c.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one parked message ID")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	var p admin.Parked
	raw, err := cl.call(ctx, http.MethodGet, "api/parked/"+url.PathEscape(pos[0]), nil, nil, &p)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	printParked(env.stdout, p)
	return nil
}

func printParked(w io.Writer, p admin.Parked) {
	rows := [][2]string{
		{"parked", strconv.FormatInt(p.ID, 10)}, {"message", p.MessageID + " " + p.MessageType},
		{"saga", strings.TrimSpace(p.SagaID + " " + p.SagaType)}, {"key", p.BusinessKey}, {"saga state", p.SagaState},
		{"step", p.Step}, {"queue", p.Queue}, {"routing", p.Exchange + " / " + p.RoutingKey},
		{"class", fmt.Sprintf("%s after %d attempt(s)", p.Class, p.Attempts)},
		{"failures", "first " + stamp(p.FirstFailureAt) + ", last " + stamp(p.ParkedAt)}, {"reason", p.Reason},
	}
	if p.LinkedBy != "" {
		rows = append(rows, [2]string{"linked", "by its " + p.LinkedBy + " (it names no saga)"})
	}
	if p.Standing != "" {
		rows = append(rows, [2]string{"standing", p.Standing + ": " + p.StandingNote})
	}
	if p.DismissedAt != nil {
		rows = append(rows, [2]string{"dismissed", stamp(*p.DismissedAt) + " by " + p.DismissedBy + ": " + p.DismissReason})
	}
	if p.ReplayedAt != nil {
		replayed := stamp(*p.ReplayedAt) + " by " + p.ReplayedBy
		if p.ReplayForced {
			replayed += ", FORCED past a refused check"
		}
		if p.ReplayReason != "" {
			replayed += ": " + p.ReplayReason
		}
		rows = append(rows, [2]string{"replayed", replayed})
	}
	if p.Body != nil {
		if len(p.Body.JSON) > 0 {
			rows = append(rows, [2]string{"body", compact(p.Body.JSON)})
		} else {
			rows = append(rows, [2]string{"body", fmt.Sprintf("%d bytes (%s)", p.Body.Size, p.Body.Note)})
		}
	}
	for _, r := range rows {
		if r[1] != "" {
			printf(w, "%-11s %s\n", r[0], r[1])
		}
	}
}

func parkedReplay(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("parked replay", env)
	var c common
	var f parkedFilterFlags
	c.register(fs)
	f.register(fs)
	reason := fs.String("reason", "", "why (required; recorded in the saga's audit trail)")
	dryRun := fs.Bool("dry-run", false, "check the saga's state only; change nothing")
	force := fs.Bool("force", false, "replay one message even when the saga-state check refuses")
	maxN := fs.Int("max", 0, fmt.Sprintf("bulk: replay at most this many (default %d, at most %d)", admin.DefaultBulk, admin.MaxBulk))
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required: every replay records why")
	}
	filter := f.filter()
	bulk := len(pos) == 0
	switch {
	case len(pos) > 1:
		return usagef("want one parked message ID (or none, with filter flags, for a bulk replay)")
	case bulk && noCriterion(filter):
		return usagef("want a parked message ID, or filter flags (--saga-type, --saga, --queue, --message-type, --reason-has)")
	case !bulk && filter != (admin.ParkedFilter{}):
		return usagef("give a parked message ID or filter flags, not both")
	case bulk && *force:
		return usagef("--force replays one message at a time")
	case !bulk && *maxN != 0:
		return usagef("--max is for bulk replays")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()

	if bulk {
		var res admin.BulkReplayResult
		raw, err := cl.call(ctx, http.MethodPost, "api/bulk/parked/replay", nil,
			admin.BulkReplayRequest{Filter: filter, Reason: *reason, DryRun: *dryRun, Max: *maxN}, &res)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(env.stdout, raw)
		}
		tw := table(env.stdout)
		fmt.Fprintln(tw, "ID\tMESSAGE\tSAGA\tOUTCOME\tCHECK")
		for _, it := range res.Items {
			printf(tw, "%d\t%s\t%s\t%s\t%s\n", it.Parked.ID, short(it.Parked.MessageType), it.Parked.SagaID, it.Outcome, it.Check.Explanation)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printf(env.stdout, "replay %s: %s", map[bool]string{true: "dry run", false: "done"}[res.DryRun], counts(res.Counts))
		if res.Truncated {
			fmt.Fprint(env.stdout, " (more match: raise --max or run again)")
		}
		fmt.Fprintln(env.stdout)
		return nil
	}

	var res admin.ReplayResult
	raw, err := cl.call(ctx, http.MethodPost, "api/parked/"+url.PathEscape(pos[0])+"/replay", nil,
		admin.ReplayRequest{Reason: *reason, DryRun: *dryRun, Force: *force}, &res)
	var f2 *apiFailure
	if errors.As(err, &f2) && f2.body.Code == "refused" {
		if c.json {
			_ = printJSON(env.stdout, f2.raw)
		}
		return fmt.Errorf("%w\n(the message is still parked; --force replays it anyway: the consumer's inbox and the saga's rules then decide its effect)", err)
	}
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	printf(env.stdout, "parked message %d: %s\n", res.Parked.ID, strings.ReplaceAll(res.Outcome, "_", " "))
	printf(env.stdout, "check: %s\n", res.Check.Explanation)
	if res.Outcome == admin.OutcomeReplayed {
		printf(env.stdout, "message %s is back in the outbox to %s / %s\n", res.MessageID, res.Parked.Exchange, res.Parked.RoutingKey)
		if len(res.AlsoMarked) > 0 {
			printf(env.stdout, "also marked replayed: %v\n", res.AlsoMarked)
		}
	}
	return nil
}

// noCriterion reports whether f selects nothing by itself (ages alone do
// not: the server refuses them for bulk actions).
func noCriterion(f admin.ParkedFilter) bool {
	f.OlderThan, f.NewerThan = "", ""
	return f == (admin.ParkedFilter{})
}

func parkedDismiss(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("parked dismiss", env)
	var c common
	var f parkedFilterFlags
	c.register(fs)
	f.register(fs)
	reason := fs.String("reason", "", "why (required; recorded on the row and in the saga's audit trail)")
	dryRun := fs.Bool("dry-run", false, "say what would happen; change nothing")
	force := fs.Bool("force", false, "dismiss one copy even though it is current (its saga waits for it)")
	maxN := fs.Int("max", 0, fmt.Sprintf("bulk: dismiss at most this many (default %d, at most %d)", admin.DefaultBulk, admin.MaxBulk))
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required: every dismissal records why")
	}
	filter := f.filter()
	bulk := len(pos) == 0
	switch {
	case len(pos) > 1:
		return usagef("want one parked message ID (or none, with filter flags, for a bulk dismissal)")
	case bulk && noCriterion(filter):
		return usagef("want a parked message ID, or filter flags (--saga-type, --saga, --queue, --message-type, --reason-has)")
	case !bulk && filter != (admin.ParkedFilter{}):
		return usagef("give a parked message ID or filter flags, not both")
	case bulk && *force:
		return usagef("--force dismisses one message at a time; a bulk dismissal never closes a current copy")
	case !bulk && *maxN != 0:
		return usagef("--max is for bulk dismissals")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	if bulk {
		var res admin.BulkDismissResult
		raw, err := cl.call(ctx, http.MethodPost, "api/bulk/parked/dismiss", nil,
			admin.BulkDismissRequest{Filter: filter, Reason: *reason, DryRun: *dryRun, Max: *maxN}, &res)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(env.stdout, raw)
		}
		tw := table(env.stdout)
		fmt.Fprintln(tw, "ID\tMESSAGE\tSAGA\tOUTCOME\tWHY")
		for _, it := range res.Items {
			printf(tw, "%d\t%s\t%s\t%s\t%s\n", it.Parked.ID, short(it.Parked.MessageType), it.Parked.SagaID, it.Outcome, it.Explanation)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printf(env.stdout, "dismiss %s: %s", map[bool]string{true: "dry run", false: "done"}[res.DryRun], counts(res.Counts))
		if res.Truncated {
			fmt.Fprint(env.stdout, " (more match: raise --max or run again)")
		}
		fmt.Fprintln(env.stdout)
		return nil
	}
	var res admin.DismissResult
	raw, err := cl.call(ctx, http.MethodPost, "api/parked/"+url.PathEscape(pos[0])+"/dismiss", nil,
		admin.DismissRequest{Reason: *reason, DryRun: *dryRun, Force: *force}, &res)
	var f2 *apiFailure
	if errors.As(err, &f2) && f2.body.Code == "refused" {
		if c.json {
			_ = printJSON(env.stdout, f2.raw)
		}
		return fmt.Errorf("%w\n(the copy stays open; --force dismisses it anyway)", err)
	}
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	printf(env.stdout, "parked message %d: %s\n", res.Parked.ID, strings.ReplaceAll(res.Outcome, "_", " "))
	printf(env.stdout, "%s\n", res.Explanation)
	return nil
}

// oneLine is the first line of s, cut to at most n bytes (at a character
// boundary).
func oneLine(s string, n int) string {
	s = firstLine(s)
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	return s
}

func sortStrings(s []string) { slices.Sort(s) }
