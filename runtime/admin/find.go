package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/parked"
	"github.com/protosaga/saga/runtime/outbox"
	"github.com/protosaga/saga/runtime/saga"
)

// handleStats answers GET /api/stats: instances per state and type (with
// the stuck ones, by saga.StuckRule as the list's stuck filter) and
// open parked messages per queue.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	ctx := r.Context()
	out := Stats{Types: make([]TypeStats, 0, len(s.sagas)), Parked: ParkedStats{ByQueue: map[string]int64{}}}
	now := s.cfg.Now()
	for _, t := range s.sagas {
		states, limits, grace := t.stuck.Args()
		rows, err := s.cfg.Pool.Query(ctx, `SELECT t.state, count(*), count(*) FILTER (WHERE `+saga.StuckSQL("$1", "$2", "$3", "$4")+`)
FROM `+t.table+` t GROUP BY t.state`, now, states, limits, grace)
		if err != nil {
			return fmt.Errorf("count %s sagas: %w", t.def.Name, err)
		}
		counts, stuck := map[string]int64{}, map[string]int64{}
		var (
			state string
			n, k  int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&state, &n, &k}, func() error { counts[state], stuck[state] = n, k; return nil }); err != nil {
			return fmt.Errorf("count %s sagas: %w", t.def.Name, err)
		}
		ts := TypeStats{Type: t.def.Name, States: make([]StateCount, 0, len(t.def.States))}
		for _, st := range t.def.States {
			ts.States = append(ts.States, StateCount{State: st.Name, Kind: st.Kind.String(), Count: counts[st.Name], Stuck: stuck[st.Name]})
			ts.Total += counts[st.Name]
			ts.Stuck += stuck[st.Name]
		}
		out.Types = append(out.Types, ts)
	}
	byQueue, err := parked.CountOpen(ctx, s.cfg.Pool)
	if err != nil {
		return err
	}
	for queue, n := range byQueue {
		out.Parked.ByQueue[queue] = n
		out.Parked.Open += n
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// maxSearchHits bounds a search's answer.
const maxSearchHits = 50

// handleSearch answers GET /api/search?q=...: the sagas (and parked
// messages) the text names, as a saga id, a business key or its prefix, the
// id of a message a saga sent or received through this database, the id
// of a parked message or a parked message's correlation id.
func (s *Server) handleSearch(w http.ResponseWriter, r *http.Request) error {
	qs, err := parseQuery(r, "q")
	if err != nil {
		return err
	}
	text := strings.TrimSpace(qs.str("q"))
	if text == "" {
		return badRequest("q: give a saga id, business key (or its start), message id or correlation id")
	}
	if err := checkText("q", text, 1000); err != nil {
		return err
	}
	ctx := r.Context()
	now := s.cfg.Now()
	res := SearchResult{Query: text, Hits: []SearchHit{}}
	seen := map[string]bool{}
	addSaga := func(t *sagaType, st saga.Status, matched string, msgID, msgType string) {
		if seen[st.ID] || len(res.Hits) >= maxSearchHits {
			res.Truncated = res.Truncated || !seen[st.ID]
			return
		}
		seen[st.ID] = true
		v := t.view(rowOf(st), now)
		res.Hits = append(res.Hits, SearchHit{Matched: matched, Saga: &v, MessageID: msgID, MessageType: msgType})
	}
	find := func(id, typeName string) (*sagaType, saga.Status, bool, error) {
		t, st, err := s.find(ctx, id, typeName)
		var ae *apiError
		if errors.As(err, &ae) {
			return nil, saga.Status{}, false, nil
		}
		return t, st, err == nil, err
	}
	// A saga id.
	if u, err := uuid.Parse(text); err == nil {
		t, st, ok, err := find(u.String(), "")
		if err != nil {
			return err
		}
		if ok {
			addSaga(t, st, "saga id", "", "")
		}
	}
	// A business key, then the keys it starts.
	for _, t := range s.sagas {
		st, err := t.engine.StatusByBusinessKey(ctx, text)
		if err == nil {
			addSaga(t, st, "business key", "", "")
		} else if !errors.Is(err, saga.ErrNotFound) {
			return fmt.Errorf("search %s by business key: %w", t.def.Name, err)
		}
	}
	// A message the sagas sent or received through this database's outbox.
	written, ok, err := outbox.Lookup(ctx, s.cfg.Pool, text)
	switch {
	case err != nil:
		return fmt.Errorf("search the outbox for message %q: %w", text, err)
	case ok:
		if _, known := s.byName[written.SagaType]; known {
			t, st, found, err := find(written.SagaID, written.SagaType)
			if err != nil {
				return err
			}
			if found {
				addSaga(t, st, "message id", text, written.MessageType)
			}
		}
	}
	// Parked messages, by their message id or correlation id.
	parked, err := s.parkedRows(ctx, parked.Search, text, maxSearchHits)
	if err != nil {
		return fmt.Errorf("search parked messages for %q: %w", text, err)
	}
	if err := s.join(ctx, parked); err != nil {
		return err
	}
	for _, p := range parked {
		matched := "parked message id"
		if p.MessageID != text {
			matched = "correlation id"
		}
		hit := SearchHit{Matched: matched, ParkedID: p.ID, MessageID: p.MessageID, MessageType: p.MessageType}
		if t, ok := s.byName[p.SagaType]; ok {
			if st, err := t.engine.Status(ctx, p.SagaID); err == nil {
				v := t.view(rowOf(st), now)
				hit.Saga = &v
			}
		}
		if len(res.Hits) >= maxSearchHits {
			res.Truncated = true
			break
		}
		res.Hits = append(res.Hits, hit)
	}
	for _, t := range s.sagas {
		page, err := t.engine.List(ctx, saga.ListFilter{KeyPrefix: text, Limit: maxSearchHits})
		if err != nil {
			return fmt.Errorf("search %s by business key prefix: %w", t.def.Name, err)
		}
		for _, st := range page.Items {
			addSaga(t, st, "business key prefix", "", "")
		}
		res.Truncated = res.Truncated || page.NextCursor != ""
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// handleOperatorLog answers GET /api/operator-log: the audit rows operators
// wrote (retry, compensate, resolve, cancel, replay, dismiss), across every
// saga, newest first.
func (s *Server) handleOperatorLog(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "operator", "action", "limit", "cursor")
	if err != nil {
		return err
	}
	limit, err := q.limit()
	if err != nil {
		return err
	}
	var clause strings.Builder
	args := []any{limit + 1}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if c := q.str("cursor"); c != "" {
		before, err := strconv.ParseInt(c, 10, 64)
		if err != nil || before <= 0 {
			return badRequest("cursor %q is not a cursor this server issued", c)
		}
		clause.WriteString(" AND a.id < " + arg(before))
	}
	if op := q.str("operator"); op != "" {
		if !principalName.MatchString(op) {
			return badRequest("operator %q is not a principal name", op)
		}
		clause.WriteString(" AND a.operator = " + arg(op))
	}
	if act := q.str("action"); act != "" {
		trig, ok := actionTriggers[act]
		switch {
		case ok:
		case act == "replay":
			trig = TriggerReplay
		case act == "dismiss":
			trig = TriggerDismiss
		default:
			return badRequest("action %q: want retry, compensate, resolve, cancel, replay or dismiss", act)
		}
		clause.WriteString(" AND a.trigger = " + arg(trig))
	}
	ctx := r.Context()
	rows, err := s.cfg.Pool.Query(ctx, `SELECT a.id, a.at, a.operator, a.trigger, a.saga_id::text, a.saga_type, a.from_state,
  a.to_state, a.message_id, a.note, a.version
FROM saga_audit a
WHERE a.operator <> '' AND a.trigger LIKE 'operator.%'`+clause.String()+`
ORDER BY a.id DESC LIMIT $1`, args...)
	if err != nil {
		return fmt.Errorf("read the operator log: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OperatorAction, error) {
		var a OperatorAction
		err := r.Scan(&a.AuditID, &a.At, &a.Operator, &a.Action, &a.SagaID, &a.SagaType, &a.From, &a.To, &a.MessageID, &a.Note, &a.Version)
		a.At = a.At.UTC()
		return a, err
	})
	if err != nil {
		return fmt.Errorf("read the operator log: %w", err)
	}
	out := OperatorLog{Items: items}
	if len(items) > limit {
		out.Items = items[:limit]
		out.NextCursor = strconv.FormatInt(out.Items[limit-1].AuditID, 10)
	}
	if err := s.businessKeys(ctx, out.Items); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// businessKeys fills in the business keys of the actions' sagas of served
// types.
func (s *Server) businessKeys(ctx context.Context, items []OperatorAction) error {
	ids := map[string][]string{}
	for _, a := range items {
		if _, ok := s.byName[a.SagaType]; ok {
			ids[a.SagaType] = append(ids[a.SagaType], a.SagaID)
		}
	}
	keys := map[string]string{}
	for typ, list := range ids {
		found, err := s.byName[typ].engine.Idents(ctx, list, nil)
		if err != nil {
			return fmt.Errorf("business keys of %s sagas: %w", typ, err)
		}
		for _, f := range found {
			keys[f.ID] = f.BusinessKey
		}
	}
	for i := range items {
		items[i].BusinessKey = keys[items[i].SagaID]
	}
	return nil
}
