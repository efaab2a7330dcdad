package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/protosaga/saga/runtime/admin"
)

// findCommand runs search, stats and log.
func findCommand(ctx context.Context, env *cliEnv, name string, args []string) error {
	switch name {
	case "search":
		return search(ctx, env, args)
	case "stats":
		return stats(ctx, env, args)
	case "log":
		return operatorLog(ctx, env, args)
	}
	return usagef("unknown command %q", name)
}

func search(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("search", env)
	var c common
	c.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || strings.TrimSpace(pos[0]) == "" {
		return usagef("want one text: a saga id, a business key (or its start), a message id or a correlation id")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	var res admin.SearchResult
	raw, err := cl.call(ctx, http.MethodGet, "api/search", url.Values{"q": {pos[0]}}, nil, &res)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "MATCHED\tSAGA\tTYPE\tBUSINESS KEY\tSTATE\tMESSAGE")
	for _, h := range res.Hits {
		var id, typ, key, state string
		if h.Saga != nil {
			id, typ, key, state = h.Saga.ID, short(h.Saga.Type), h.Saga.BusinessKey, h.Saga.State
		}
		msg := ""
		if h.MessageID != "" {
			msg = short(h.MessageType) + " " + h.MessageID
		}
		if h.ParkedID != 0 {
			msg = strings.TrimSpace(fmt.Sprintf("parked #%d %s", h.ParkedID, msg))
		}
		printf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Matched, id, typ, key, state, msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printf(env.stdout, "%d match(es)%s\n", len(res.Hits), map[bool]string{true: " (more: narrow the text)", false: ""}[res.Truncated])
	return nil
}

func stats(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("stats", env)
	var c common
	c.register(fs)
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
	var res admin.Stats
	raw, err := cl.call(ctx, http.MethodGet, "api/stats", nil, nil, &res)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "TYPE\tSTATE\tKIND\tSAGAS\tSTUCK")
	for _, t := range res.Types {
		for _, s := range t.States {
			stuck := ""
			if s.Stuck > 0 {
				stuck = strconv.FormatInt(s.Stuck, 10)
			}
			printf(tw, "%s\t%s\t%s\t%d\t%s\n", short(t.Type), s.State, s.Kind, s.Count, stuck)
		}
		printf(tw, "%s\t(all)\t\t%d\t%d\n", short(t.Type), t.Total, t.Stuck)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	queues := make([]string, 0, len(res.Parked.ByQueue))
	for q := range res.Parked.ByQueue {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	parts := make([]string, len(queues))
	for i, q := range queues {
		parts[i] = fmt.Sprintf("%s %d", q, res.Parked.ByQueue[q])
	}
	printf(env.stdout, "open parked messages: %d", res.Parked.Open)
	if len(parts) > 0 {
		printf(env.stdout, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(env.stdout)
	return nil
}

func operatorLog(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("log", env)
	var c common
	c.register(fs)
	operator := fs.String("operator", "", "only this operator's actions")
	action := fs.String("action", "", "only this action: retry, compensate, resolve, cancel, replay or dismiss")
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
	if *operator != "" {
		q.Set("operator", *operator)
	}
	if *action != "" {
		q.Set("action", *action)
	}
	items, next, printed, err := listPages(ctx, cl, env, c.json, *all, "api/operator-log", q,
		func(p admin.OperatorLog) ([]admin.OperatorAction, string) { return p.Items, p.NextCursor })
	if err != nil || printed {
		return err
	}
	if c.json {
		return writeJSON(env.stdout, admin.OperatorLog{Items: items})
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "TIME\tOPERATOR\tACTION\tSAGA\tBUSINESS KEY\tSTATE\tNOTE")
	for _, a := range items {
		move := a.To
		if a.From != a.To {
			move = a.From + " -> " + a.To
		}
		printf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", stamp(a.At), a.Operator, strings.TrimPrefix(a.Action, "operator."), a.SagaID,
			a.BusinessKey, move, oneLine(a.Note, 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintln(env.stdout, "more: use --all")
	} else {
		printf(env.stdout, "%d action(s)\n", len(items))
	}
	return nil
}
