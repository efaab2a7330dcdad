package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/protosaga/saga/runtime/internal/where"
)

// parkedRow is a saga_parked row.
type parkedRow struct {
	Parked
	headers []byte
	body    []byte
}

const parkedColumns = `id, message_id, queue, message_type, saga_id, saga_type, correlation_id, class, reason,
	attempts, exchange, routing_key, headers, body, first_failure_at, parked_at, replayed_at, replayed_by,
	replay_reason, replay_forced`

func scanParked(r pgx.Row) (parkedRow, error) {
	var p parkedRow
	err := r.Scan(&p.ID, &p.MessageID, &p.Queue, &p.MessageType, &p.SagaID, &p.SagaType, &p.CorrelationID,
		&p.Class, &p.Reason, &p.Attempts, &p.Exchange, &p.RoutingKey, &p.headers, &p.body,
		&p.FirstFailureAt, &p.ParkedAt, &p.ReplayedAt, &p.ReplayedBy, &p.ReplayReason, &p.ReplayForced)
	p.FirstFailureAt, p.ParkedAt, p.ReplayedAt = p.FirstFailureAt.UTC(), p.ParkedAt.UTC(), utcPtr(p.ReplayedAt)
	return p, err
}

// parkedRows runs SELECT parkedColumns FROM saga_parked <where>.
func (s *Server) parkedRows(ctx context.Context, clause string, args ...any) ([]parkedRow, error) {
	rows, err := s.cfg.Pool.Query(ctx, `SELECT `+parkedColumns+` FROM saga_parked `+clause, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (parkedRow, error) { return scanParked(r) })
}

// parkedListSQL selects at most limit open (or, with f.IncludeReplayed,
// all) parked messages matching f, in order (newest first for listing,
// oldest first for replaying), with ids below before (0: from the newest).
func parkedListSQL(f ParkedFilter, order parkedOrder, before int64, limit int) (string, []any) {
	var w where.Clause
	if !f.IncludeReplayed {
		w.And("replayed_at IS NULL")
	}
	for _, c := range []struct{ column, v string }{
		{"saga_type", f.SagaType}, {"saga_id", f.SagaID}, {"queue", f.Queue}, {"message_type", f.MessageType},
	} {
		if c.v != "" {
			w.And(c.column + " = " + w.Arg(c.v))
		}
	}
	if before != 0 {
		w.And("id < " + w.Arg(before))
	}
	return w.String() + `
ORDER BY id ` + string(order) + ` LIMIT ` + w.Arg(limit), w.Args
}

// parkedOrder is the order of a list of parked messages.
type parkedOrder string

const (
	newestFirst parkedOrder = "DESC" // listing: what was parked last comes first
	oldestFirst parkedOrder = "ASC"  // replaying: messages go out again in the order they were parked
)

// normalized validates f and returns it with its saga id in canonical form
// (the form consumers record, and /api/sagas/{id} accepts in any case).
func (f ParkedFilter) normalized() (ParkedFilter, error) {
	if f.SagaID != "" {
		id, err := parseSagaID(f.SagaID)
		if err != nil {
			return f, err
		}
		f.SagaID = id
	}
	for _, c := range []struct{ name, v string }{{"saga_type", f.SagaType}, {"queue", f.Queue}, {"message_type", f.MessageType}} {
		if err := checkText(c.name, c.v, 255); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (s *Server) listParked(ctx context.Context, f ParkedFilter, order parkedOrder, before int64, limit int) ([]parkedRow, error) {
	f, err := f.normalized()
	if err != nil {
		return nil, err
	}
	clause, args := parkedListSQL(f, order, before, limit)
	rows, err := s.parkedRows(ctx, clause, args...)
	if err != nil {
		return nil, fmt.Errorf("list parked messages: %w", err)
	}
	return rows, s.join(ctx, rows)
}

// join fills in each parked row's saga: business key, state and the step
// its message belongs to. Rows of saga types this server does not serve,
// without a saga, or whose saga id is not a UUID in the form parseSagaID
// accepts (a consumer parks whatever a message said), are left as they are.
func (s *Server) join(ctx context.Context, rows []parkedRow) error {
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
		t := s.byName[typ]
		rs, err := s.cfg.Pool.Query(ctx, `SELECT id::text, business_key, state FROM `+t.table+` WHERE id = ANY($1::uuid[])`, list)
		if err != nil {
			return fmt.Errorf("join parked messages to %s sagas: %w", typ, err)
		}
		var id, key, state string
		_, err = pgx.ForEachRow(rs, []any{&id, &key, &state}, func() error {
			found[typ+"/"+id] = keyState{key, state}
			return nil
		})
		if err != nil {
			return fmt.Errorf("join parked messages to %s sagas: %w", typ, err)
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

func (s *Server) handleListParked(w http.ResponseWriter, r *http.Request) error {
	q, err := parseQuery(r, "saga_type", "saga_id", "queue", "message_type", "include_replayed", "limit", "cursor")
	if err != nil {
		return err
	}
	f := ParkedFilter{SagaType: q.str("saga_type"), SagaID: q.str("saga_id"), Queue: q.str("queue"), MessageType: q.str("message_type")}
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
	rows, err := s.listParked(r.Context(), f, newestFirst, before, limit+1)
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

// loadParked returns one parked message joined to its saga, with its body.
func (s *Server) loadParked(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, id int64) (parkedRow, error) {
	rows, err := q.Query(ctx, `SELECT `+parkedColumns+` FROM saga_parked WHERE id = $1`, id)
	if err != nil {
		return parkedRow{}, fmt.Errorf("load parked message %d: %w", id, err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (parkedRow, error) { return scanParked(r) })
	if err != nil {
		return parkedRow{}, fmt.Errorf("load parked message %d: %w", id, err)
	}
	if len(ps) == 0 {
		return parkedRow{}, apiErr(http.StatusNotFound, "not_found", "no parked message %d", id)
	}
	return ps[0], nil
}

func (s *Server) handleParked(w http.ResponseWriter, r *http.Request) error {
	if _, err := parseQuery(r); err != nil {
		return err
	}
	id, err := parseParkedID(r.PathValue("id"))
	if err != nil {
		return err
	}
	p, err := s.loadParked(r.Context(), s.cfg.Pool, id)
	if err != nil {
		return err
	}
	rows := []parkedRow{p}
	if err := s.join(r.Context(), rows); err != nil {
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
