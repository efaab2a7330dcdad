package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/protosaga/saga/runtime/admin"
)

func callbacksCommand(ctx context.Context, env *cliEnv, sub string, args []string) error {
	switch sub {
	case "list":
		return callbacksList(ctx, env, args)
	case "replay":
		return callbacksReplay(ctx, env, args)
	}
	return usagef("unknown subcommand %q (want list or replay)", sub)
}

func callbacksList(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("callbacks list", env)
	var c common
	c.register(fs)
	sagaID := fs.String("saga", "", "saga id")
	status := fs.String("status", "", "pending, delivered or parked")
	limit := fs.Int("limit", admin.DefaultPageSize, fmt.Sprintf("at most this many, newest first (1-%d)", admin.MaxPageSize))
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
	if *sagaID != "" {
		q.Set("saga", *sagaID)
	}
	if *status != "" {
		q.Set("status", *status)
	}
	var list admin.CallbackList
	raw, err := cl.call(ctx, http.MethodGet, "api/callbacks", q, nil, &list)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	tw := table(env.stdout)
	fmt.Fprintln(tw, "ID\tSAGA\tEVENT\tSTATUS\tATTEMPTS\tTARGET\tCREATED\tLAST\tREASON")
	for _, cb := range list.Callbacks {
		target := cb.URL
		if cb.Client != "" {
			target = "client " + cb.Client
		}
		last := cb.LastError
		if last == "" && cb.LastStatus != 0 {
			last = "HTTP " + strconv.Itoa(cb.LastStatus)
		}
		printf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cb.ID, cb.SagaID, cb.Event, string(cb.Status), cb.Attempts, target,
			stamp(cb.CreatedAt), firstLine(last), firstLine(cb.ParkReason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printf(env.stdout, "%d callback(s)\n", len(list.Callbacks))
	return nil
}

func callbacksReplay(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlagSet("callbacks replay", env)
	var c common
	c.register(fs)
	reason := fs.String("reason", "", "why (required; recorded in saga_callback_audit)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one callback ID")
	}
	if strings.TrimSpace(*reason) == "" {
		return usagef("--reason is required: every replay records why")
	}
	ctx, cancel, cl, err := c.connect(ctx, env)
	if err != nil {
		return err
	}
	defer cancel()
	var res admin.CallbackReplayResult
	raw, err := cl.call(ctx, http.MethodPost, "api/callbacks/"+url.PathEscape(pos[0])+"/replay", nil,
		admin.CallbackReplayRequest{Reason: *reason}, &res)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(env.stdout, raw)
	}
	printf(env.stdout, "callback %s: due again (saga %s, %s), replayed by %s: %s\n", res.Callback.ID, res.Callback.SagaID,
		res.Callback.Event, res.Operator, res.Reason)
	return nil
}
