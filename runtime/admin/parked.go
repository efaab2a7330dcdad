package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/protosaga/saga/runtime/internal/parked"
)

// parkedRow is a saga_parked row.
type parkedRow struct {
	Parked
	headers []byte
	body    []byte
	// correlationKey is the message's correlation field, kept when it was
	// parked naming no saga.
	correlationKey string
}

// open reports whether the row is neither replayed nor dismissed.
func (p parkedRow) open() bool { return p.ReplayedAt == nil && p.DismissedAt == nil }

// routing names p's message and routing in the parked store.
func (p parkedRow) routing() parked.Routing {
	return parked.Routing{MessageID: p.MessageID, Exchange: p.Exchange, RoutingKey: p.RoutingKey}
}

// parkedRowOf is a saga_parked row as the admin server shows it.
func parkedRowOf(r parked.Row) parkedRow {
	return parkedRow{
		Parked: Parked{
			ID: r.ID, MessageID: r.MessageID, Queue: r.Queue, MessageType: r.MessageType, SagaID: r.SagaID,
			SagaType: r.SagaType, CorrelationID: r.CorrelationID, Class: r.Class, Reason: r.Reason, Attempts: r.Attempts,
			Exchange: r.Exchange, RoutingKey: r.RoutingKey, FirstFailureAt: r.FirstFailureAt, ParkedAt: r.ParkedAt,
			ReplayedAt: r.ReplayedAt, ReplayedBy: r.ReplayedBy, ReplayReason: r.ReplayReason, ReplayForced: r.ReplayForced,
			DismissedAt: r.DismissedAt, DismissedBy: r.DismissedBy, DismissReason: r.DismissReason,
		},
		headers: r.Headers, body: r.Body, correlationKey: r.CorrelationKey,
	}
}

// parkedRowsOf is parkedRowOf of each of rs.
func parkedRowsOf(rs []parked.Row) []parkedRow {
	out := make([]parkedRow, len(rs))
	for i, r := range rs {
		out[i] = parkedRowOf(r)
	}
	return out
}

// parkedRows reads the saga_parked rows clause selects (parked.Select).
func (s *Server) parkedRows(ctx context.Context, clause string, args ...any) ([]parkedRow, error) {
	rs, err := parked.Select(ctx, s.cfg.Pool, clause, args...)
	if err != nil {
		return nil, err
	}
	return parkedRowsOf(rs), nil
}

// parkedQuery is a validated ParkedFilter.
type parkedQuery struct {
	ParkedFilter
	// correlations are the correlation keys of messages parked without a
	// saga id that belong to the saga of SagaID (its id and business key).
	correlations []string
	olderThan    time.Duration
	newerThan    time.Duration
}

// filter is q as the parked store selects it.
func (q parkedQuery) filter() parked.Filter {
	return parked.Filter{
		IncludeClosed: q.IncludeReplayed, SagaType: q.SagaType, Queue: q.Queue, MessageType: q.MessageType,
		SagaID: q.SagaID, Correlations: q.correlations, Reason: q.Reason, OlderThan: q.olderThan, NewerThan: q.newerThan,
	}
}

// query validates f and returns it with its saga id in canonical form
// (the form consumers record, and /api/sagas/{id} accepts in any case) and
// the correlation ids of the saga's messages parked without a saga id.
func (s *Server) query(ctx context.Context, f ParkedFilter) (parkedQuery, error) {
	q := parkedQuery{ParkedFilter: f}
	if f.SagaID != "" {
		id, err := parseSagaID(f.SagaID)
		if err != nil {
			return q, err
		}
		q.SagaID = id
		q.correlations = []string{id}
		for _, t := range s.sagas {
			if st, err := t.engine.Status(ctx, id); err == nil {
				q.correlations = append(q.correlations, st.BusinessKey)
				break
			}
		}
	}
	for _, c := range []struct{ name, v string }{{"saga_type", f.SagaType}, {"queue", f.Queue}, {"message_type", f.MessageType}, {"reason", f.Reason}} {
		if err := checkText(c.name, c.v, 255); err != nil {
			return q, err
		}
	}
	for _, d := range []struct {
		name, v string
		dst     *time.Duration
	}{{"older_than", f.OlderThan, &q.olderThan}, {"newer_than", f.NewerThan, &q.newerThan}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v <= 0 {
			return q, badRequest("%s=%q: want a positive Go duration such as 90s or 2h", d.name, d.v)
		}
		*d.dst = v
	}
	if q.olderThan > 0 && q.newerThan > 0 && q.olderThan >= q.newerThan {
		return q, badRequest("older_than %s and newer_than %s: an empty window", q.olderThan, q.newerThan)
	}
	return q, nil
}

// listParked lists the parked messages f selects, joined to their sagas,
// with the standing of the open ones.
func (s *Server) listParked(ctx context.Context, f ParkedFilter, order parked.Order, before int64, limit int) ([]parkedRow, error) {
	q, err := s.query(ctx, f)
	if err != nil {
		return nil, err
	}
	clause, args := parked.ListSQL(q.filter(), order, before, limit)
	rows, err := s.parkedRows(ctx, clause, args...)
	if err != nil {
		return nil, fmt.Errorf("list parked messages: %w", err)
	}
	if err := s.join(ctx, rows); err != nil {
		return nil, err
	}
	return rows, s.stand(ctx, rows)
}

// join fills in each parked row's saga: business key, state and the step
// its message belongs to. A row without a saga id whose message belongs to
// a served saga type is linked to the saga its correlation id names (as
// business key, or as saga id), as the saga's consumer would have found it
// (Parked.LinkedBy). Rows of saga types this server does not serve, or
// whose saga id is not a UUID in the form parseSagaID accepts (a consumer
// parks whatever a message said), are left as they are.
func (s *Server) join(ctx context.Context, rows []parkedRow) error {
	if err := s.link(ctx, rows); err != nil {
		return err
	}
	ids := map[string][]string{}
	canonical := make([]string, len(rows)) // "" where there is nothing to join
	for i := range rows {
		p := &rows[i]
		t, ok := s.byName[p.SagaType]
		if !ok {
			continue
		}
		if ref, ok := t.def.Lookup(p.MessageType); ok {
			p.Step = ref.Step
		}
		if id, err := parseSagaID(p.SagaID); err == nil {
			ids[p.SagaType] = append(ids[p.SagaType], id)
			canonical[i] = id
		}
	}
	type keyState struct{ key, state string }
	found := map[string]keyState{}
	for typ, list := range ids {
		idents, err := s.byName[typ].engine.Idents(ctx, list, nil)
		if err != nil {
			return fmt.Errorf("join parked messages to %s sagas: %w", typ, err)
		}
		for _, f := range idents {
			found[typ+"/"+f.ID] = keyState{f.BusinessKey, f.State}
		}
	}
	for i := range rows {
		if canonical[i] == "" {
			continue
		}
		if ks, ok := found[rows[i].SagaType+"/"+canonical[i]]; ok {
			rows[i].BusinessKey, rows[i].SagaState = ks.key, ks.state
		}
	}
	return nil
}

// link joins rows that name no saga to the saga their correlation field
// (message.Message.CorrelationKey: a business key, or a saga id) names, as
// the saga's consumer finds it: the value parking kept, or else the one
// read from the body. Only saga types whose definition names the message
// are asked.
func (s *Server) link(ctx context.Context, rows []parkedRow) error {
	type want struct {
		row int
		key string
	}
	byType := map[*sagaType][]want{}
	for i := range rows {
		p := &rows[i]
		if p.SagaID != "" || p.SagaType != "" {
			continue
		}
		key := p.correlationKey
		if key == "" { // parked before parking kept it
			key = s.correlationKey(p.MessageType, p.body)
		}
		if key == "" {
			continue
		}
		for _, t := range s.sagas {
			if _, ok := t.def.Lookup(p.MessageType); ok || t.def.StartMessage == p.MessageType {
				byType[t] = append(byType[t], want{i, key})
			}
		}
	}
	for _, t := range s.sagas { // in Config order: the first type that has the saga wins
		ws := byType[t]
		if len(ws) == 0 {
			continue
		}
		keys, ids := make([]string, 0, len(ws)), []string{}
		for _, w := range ws {
			keys = append(keys, w.key)
			if u, err := uuid.Parse(w.key); err == nil {
				ids = append(ids, u.String())
			}
		}
		idents, err := t.engine.Idents(ctx, ids, keys)
		if err != nil {
			return fmt.Errorf("link parked messages to %s sagas: %w", t.def.Name, err)
		}
		byKey := map[string]string{}
		for _, f := range idents {
			byKey[f.BusinessKey], byKey[f.ID] = f.ID, f.ID
		}
		for _, w := range ws {
			p := &rows[w.row]
			if p.LinkedBy != "" {
				continue
			}
			k := w.key
			if u, err := uuid.Parse(k); err == nil {
				k = u.String()
			}
			if id, ok := byKey[k]; ok {
				p.SagaID, p.SagaType, p.LinkedBy = id, t.def.Name, "correlation"
			}
		}
	}
	return nil
}

// correlationKey decodes body as typ and returns its correlation field's
// value, or "" when the type is unknown or the body does not decode.
func (s *Server) correlationKey(typ string, body []byte) string {
	info, ok := s.lookup(typ)
	if !ok || info.New == nil {
		return ""
	}
	m := info.New()
	if proto.Unmarshal(body, m) != nil {
		return ""
	}
	return m.CorrelationKey()
}

// stand sets the standing of every open row with a saga: whether replaying
// it now would act (current) or it no longer applies (superseded), by the
// saga-state check a replay makes (read only, nothing locked).
func (s *Server) stand(ctx context.Context, rows []parkedRow) error {
	for i := range rows {
		p := &rows[i]
		if !p.open() {
			continue
		}
		standing, note, err := s.standing(ctx, nil, *p)
		if err != nil {
			return err
		}
		p.Standing, p.StandingNote = standing, note
	}
	return nil
}

// standing judges one open row with the replay check; tx locks the saga's
// row when set (a dismissal decides on it), and may be nil.
func (s *Server) standing(ctx context.Context, tx pgx.Tx, p parkedRow) (standing, note string, err error) {
	if p.SagaID == "" {
		return "", "it names no saga", nil
	}
	t, st, check, err := s.check(ctx, tx, p, tx == nil)
	if err != nil {
		return "", "", err
	}
	switch {
	case t == nil || st == nil:
		return "", check.Explanation, nil
	case check.Allowed:
		return StandingCurrent, check.Explanation, nil
	}
	return StandingSuperseded, check.Explanation, nil
}

func (s *Server) handleListParked(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "saga_type", "saga_id", "queue", "message_type", "reason", "older_than", "newer_than",
		"include_replayed", "limit", "cursor")
	if err != nil {
		return err
	}
	f := ParkedFilter{SagaType: q.str("saga_type"), SagaID: q.str("saga_id"), Queue: q.str("queue"), MessageType: q.str("message_type"),
		Reason: q.str("reason"), OlderThan: q.str("older_than"), NewerThan: q.str("newer_than")}
	if f.IncludeReplayed, err = q.boolean("include_replayed"); err != nil {
		return err
	}
	limit, err := q.limit()
	if err != nil {
		return err
	}
	var before int64
	if c := q.str("cursor"); c != "" {
		before, err = strconv.ParseInt(c, 10, 64)
		if err != nil || before <= 0 {
			return badRequest("cursor %q is not a cursor this server issued", c)
		}
	}
	rows, err := s.listParked(r.Context(), f, parked.NewestFirst, before, limit+1)
	if err != nil {
		return err
	}
	page := ParkedPage{Items: make([]Parked, 0, min(len(rows), limit))}
	for i, p := range rows {
		if i == limit {
			page.NextCursor = strconv.FormatInt(rows[i-1].ID, 10)
			break
		}
		page.Items = append(page.Items, p.Parked)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// parseParkedID validates a parked message id from a path.
func parseParkedID(raw string) (int64, error) {
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != raw {
		return 0, badRequest("parked message id %q: want a positive whole number", raw)
	}
	return id, nil
}

// loadParked returns one parked message, with its body, locked FOR
// UPDATE when lock is set (q is then a transaction).
func (s *Server) loadParked(ctx context.Context, q parked.Querier, id int64, lock bool) (parkedRow, error) {
	r, ok, err := parked.Get(ctx, q, id, lock)
	if err != nil {
		return parkedRow{}, fmt.Errorf("load parked message %d: %w", id, err)
	}
	if !ok {
		return parkedRow{}, apiErr(http.StatusNotFound, "not_found", "no parked message %d", id)
	}
	return parkedRowOf(r), nil
}

func (s *Server) handleParked(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id, err := parseParkedID(r.PathValue("id"))
	if err != nil {
		return err
	}
	p, err := s.loadParked(r.Context(), s.cfg.Pool, id, false)
	if err != nil {
		return err
	}
	rows := []parkedRow{p}
	if err := s.join(r.Context(), rows); err != nil {
		return err
	}
	if err := s.stand(r.Context(), rows); err != nil {
		return err
	}
	out := rows[0].Parked
	out.Body = s.body(p.MessageType, p.body)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// headerMap decodes a parked row's headers (jsonb).
func (p parkedRow) headerMap() map[string]any {
	h := map[string]any{}
	if len(p.headers) > 0 {
		_ = json.Unmarshal(p.headers, &h)
	}
	return h
}
