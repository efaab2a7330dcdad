// Package text renders the non-Go artifacts of a contract from the
// templates in /templates: per saga, its SQL migrations, its Markdown page
// with a Mermaid state diagram, and its BPMN 2.0 process with a laid-out
// diagram (bpmn.go).
package text

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"text/template"

	"github.com/protosaga/saga/internal/gen/model"
	sagav1 "github.com/protosaga/saga/options/saga/v1"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/templates"
)

// Renderer holds the parsed templates.
type Renderer struct {
	t *template.Template
}

// New parses the templates.
func New() (*Renderer, error) {
	t, err := templates.Parse(template.FuncMap{
		"sqlList": sqlList,
		"inc":     func(i int) int { return i + 1 },
		"codes":   codes,
		"x":       xmlText,
	})
	if err != nil {
		return nil, fmt.Errorf("parse templates: %w", err)
	}
	return &Renderer{t: t}, nil
}

// File is one rendered file; Name is relative to the saga's Go package
// directory.
type File struct {
	Name    string
	Content []byte
}

func (r *Renderer) exec(name string, data any) ([]byte, error) {
	var b bytes.Buffer
	if err := r.t.ExecuteTemplate(&b, name, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}
	return b.Bytes(), nil
}

type sqlData struct {
	FullName     string
	Table        string
	States       []string
	ManualReview string
}

// Migrations renders the saga's migration files: the table (never
// rewritten), its state constraint, whose file name carries a hash of
// the state set so a changed set is a new file, and the indexes that
// replaced two of the table file's.
func (r *Renderer) Migrations(s *model.Saga) ([]File, error) {
	d := sqlData{FullName: s.FullName, Table: s.Table, ManualReview: sagadef.StateManualReview}
	for _, st := range s.Definition.States {
		d.States = append(d.States, st.Name)
	}
	create, err := r.exec("saga_create.sql.tmpl", d)
	if err != nil {
		return nil, err
	}
	states, err := r.exec("saga_states.sql.tmpl", d)
	if err != nil {
		return nil, err
	}
	indexes, err := r.exec("saga_indexes.sql.tmpl", d)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(strings.Join(d.States, "\n")))
	dir := "migrations/" + s.Table + "/"
	return []File{
		{Name: dir + "0001_create_" + s.Table + ".sql", Content: create},
		{Name: dir + "0002_states_" + hex.EncodeToString(sum[:4]) + ".sql", Content: states},
		{Name: dir + "0003_indexes.sql", Content: indexes},
	}, nil
}

// xmlText escapes s for XML character data and attribute values.
func xmlText(s string) string { return xmlEscaper.Replace(s) }

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

func sqlList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	return strings.Join(q, ", ")
}

func codes(ss []string) string {
	if len(ss) == 0 {
		return "—"
	}
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "`" + s + "`"
	}
	return strings.Join(q, ", ")
}

type docStep struct {
	Name, Role, Command      string
	External                 bool
	Success, Failure         []string
	Compensation             string
	CompensationReplies      []string
	CompensationFailure      []string
	Timeout, OnTimeout, Late string
	MaxAttempts              int
}

type docMessage struct {
	FullName, Kind, Exchange, RoutingKey string
	IdempotencyKey, Correlation          string
	SchemaVersion                        int32
	// Delivery says what the contract declares about the message's
	// delivery: subscribers, retry policy, time to be received.
	Delivery string
}

// docCancel is a saga's business cancellation on its page.
type docCancel struct {
	Message, Kind, Correlation, RequestedBy, Reason string
	// While names the steps during which a cancel compensates ("A, B or
	// C"); empty when there are none.
	While string
}

type docData struct {
	Cancel *docCancel
	// Callback describes the saga's HTTP callbacks ("" for none).
	Callback                                                                    string
	FullName, Source, Start, BusinessKey, Data, Deadline, Table, Queue, Service string
	Steps                                                                       []docStep
	Messages                                                                    []docMessage
	States                                                                      []sagadef.State
	Transitions                                                                 []sagadef.Transition
	Diagram                                                                     string
	// Groups describes the saga's parallel groups.
	Groups []docGroup
	// Children are the child steps; Replies the outcome replies by which
	// the saga answers a parent (nil when it declares none).
	Children []docChild
	Replies  *docReplies
}

// docGroup is a parallel group for the saga page.
type docGroup struct {
	Name, State, Timeout, Members string
}

// docChild is a child step: the saga it starts and where that saga's page is.
type docChild struct {
	Step, Saga, Page, Start, Cancel string
}

// docReplies are a child saga's outcome replies.
type docReplies struct {
	Completed, Failed, Cancelled, ManualReview string
}

// relPage returns the path of the Markdown page of saga c relative to the
// directory of saga s's page.
func relPage(s, c *model.Saga) string {
	from := strings.Split(path.Dir(s.File.GeneratedFilenamePrefix), "/")
	to := strings.Split(path.Dir(c.File.GeneratedFilenamePrefix), "/")
	i := 0
	for i < len(from) && i < len(to) && from[i] == to[i] {
		i++
	}
	var parts []string
	for range from[i:] {
		parts = append(parts, "..")
	}
	parts = append(parts, to[i:]...)
	parts = append(parts, c.Snake+".saga.md")
	return path.Join(parts...)
}

// delivery describes a message's declared subscribers, retry policy and
// time to be received for its row of the Messages table ("—": none).
func delivery(m *model.Message) string {
	var parts []string
	if len(m.Subscribers) > 0 {
		parts = append(parts, "subscribers `"+strings.Join(m.Subscribers, "`, `")+"`")
	}
	if p := m.Retry; p != nil {
		var tiers []string
		for _, d := range p.Tiers {
			tiers = append(tiers, d.String())
		}
		queue := "its owner's queue"
		if m.Kind == sagav1.Kind_KIND_EVENT {
			queue = "its subscribers' queues"
		}
		r := fmt.Sprintf("retry on %s: %d deliveries", queue, p.MaxAttempts)
		if len(tiers) > 0 {
			r += ", waits " + strings.Join(tiers, ", ")
		}
		parts = append(parts, r)
	}
	if m.TimeToBeReceived > 0 {
		parts = append(parts, "expires "+m.TimeToBeReceived.String()+" after it is sent")
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, "; ")
}

// Doc renders the saga's Markdown page.
func (r *Renderer) Doc(s *model.Saga) ([]byte, error) {
	d := docData{
		FullName: s.FullName, Source: s.File.Desc.Path(), Start: s.Start.FullName, BusinessKey: s.BusinessKey.Path,
		Data: string(s.Data.Desc.FullName()), Table: s.Table, Queue: s.Queue, Service: s.Service,
		States: s.Definition.States, Transitions: s.Definition.Transitions,
	}
	if s.Deadline > 0 {
		d.Deadline = s.Deadline.String()
	}
	if c := s.Definition.Callback; c.Declared() {
		target := "the URL in `" + c.URLField + "`"
		if c.ClientField != "" {
			target = "the endpoint registered for the client in `" + c.ClientField + "`"
		}
		d.Callback = "`" + strings.Join(c.States, "`, `") + "` to " + target
		if c.IncludeData {
			d.Callback += ", with the saga data"
		}
		d.Callback += " (signed HTTP callbacks, docs/callbacks.md)"
	}
	if c := s.Cancel; c != nil {
		d.Cancel = &docCancel{
			Message: c.Message.FullName, Kind: strings.ToLower(strings.TrimPrefix(c.Message.Kind.String(), "KIND_")),
			Correlation: c.Message.Correlation.Path, RequestedBy: c.RequestedBy.Path, Reason: c.Reason.Path,
		}
		var while []string
		for _, st := range s.Definition.Steps {
			if st.Role != sagadef.RoleRetriable {
				while = append(while, st.Name)
			}
		}
		if n := len(while); n > 1 {
			d.Cancel.While = strings.Join(while[:n-1], ", ") + " or " + while[n-1]
		} else if n == 1 {
			d.Cancel.While = while[0]
		}
	}
	for _, st := range s.Definition.Steps {
		role := st.Role.String()
		if st.Conditional {
			role += ", conditional (the decider may skip it)"
		}
		if st.Group != "" {
			role += ", in parallel group " + st.Group
		}
		if st.Child != "" {
			role += ", starts a [child saga](#child-sagas)"
		}
		ds := docStep{
			Name: st.Name, Role: role, Command: st.Command, External: st.External,
			Success: st.SuccessReplies, Failure: st.FailureReplies, Compensation: st.Compensation,
			CompensationFailure: st.CompensationFailureReplies,
			Timeout:             st.Timeout.String(), OnTimeout: st.OnTimeout.String(), Late: st.Late.String(),
			MaxAttempts: st.MaxAttempts,
		}
		if st.CompensationReply != "" {
			ds.CompensationReplies = []string{st.CompensationReply}
		}
		d.Steps = append(d.Steps, ds)
	}
	for _, g := range s.Definition.Groups {
		d.Groups = append(d.Groups, docGroup{Name: g.Name, State: sagadef.StateName(g.Name), Timeout: g.Timeout.String(),
			Members: strings.Join(s.Definition.Members(g.Name), ", ")})
	}
	msgs := []*model.Message{s.Start}
	for _, m := range append(append([]*model.Message(nil), s.Commands...), s.Handles...) {
		if m != s.Start {
			msgs = append(msgs, m)
		}
	}
	for _, m := range msgs {
		dm := docMessage{
			FullName: m.FullName, Kind: strings.ToLower(strings.TrimPrefix(m.Kind.String(), "KIND_")),
			Exchange: m.Exchange, RoutingKey: m.RoutingKey, SchemaVersion: m.SchemaVersion,
		}
		var keys []string
		for _, k := range m.IdempotencyKey {
			keys = append(keys, k.Path)
		}
		dm.IdempotencyKey = strings.Join(keys, ", ")
		if m.Correlation != nil {
			dm.Correlation = m.Correlation.Path
		}
		dm.Delivery = delivery(m)
		d.Messages = append(d.Messages, dm)
	}
	for _, st := range s.Steps {
		if c := st.Child; c != nil {
			dc := docChild{Step: st.Name, Saga: c.FullName, Page: relPage(s, c), Start: c.Start.FullName}
			if st.Compensation != nil {
				dc.Cancel = st.Compensation.FullName
			}
			d.Children = append(d.Children, dc)
		}
	}
	if r := s.Replies; r != nil && r.Completed != nil && r.Failed != nil {
		d.Replies = &docReplies{Completed: r.Completed.FullName, Failed: r.Failed.FullName}
		if r.Cancelled != nil {
			d.Replies.Cancelled = r.Cancelled.FullName
		}
		if r.ManualReview != nil {
			d.Replies.ManualReview = r.ManualReview.FullName
		}
	}
	d.Diagram = strings.TrimRight(s.Definition.Mermaid(), "\n")
	return r.exec("saga.md.tmpl", d)
}
