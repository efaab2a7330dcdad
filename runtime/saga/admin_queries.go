package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/message"
	"github.com/protosaga/saga/runtime/sagadef"
)

// This file holds what the operator surfaces (package admin) need from the
// engine beyond Status, History and the operator actions.

// Registry returns the message registry the engine was configured with, or
// nil when it has none. Operator views decode message bodies through it.
func (e *Engine) Registry() *message.Registry { return e.cfg.Registry }

// StatusTx returns the instance with id sagaID as tx sees it, and locks its
// row (FOR UPDATE) until tx ends: nothing else changes the instance
// meanwhile, so a decision made on this status (an operator's check before
// a replay) still holds when tx commits. It returns an error wrapping
// ErrNotFound when there is none.
func (e *Engine) StatusTx(ctx context.Context, tx pgx.Tx, sagaID string) (Status, error) {
	if _, err := uuid.Parse(sagaID); err != nil {
		return Status{}, fmt.Errorf("saga %s %q: %w (not a UUID)", e.def.Name, sagaID, ErrNotFound)
	}
	if err := txq.Sync(ctx, tx); err != nil {
		return Status{}, err
	}
	w, err := e.loadIn(ctx, tx, e.q.lockByID, sagaID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Status{}, fmt.Errorf("saga %s %s: %w", e.def.Name, sagaID, err)
		}
		return Status{}, fmt.Errorf("lock saga %s %s: %w", e.def.Name, sagaID, err)
	}
	return e.status(w)
}

// Note is an audited operator action that goes around the state machine:
// it changes nothing about the instance but belongs in its audit trail (for
// example, replaying one of its parked messages).
type Note struct {
	SagaID string
	// Trigger names the action (e.g. "operator.replay"). It must not be one
	// of the sagadef.Trigger* constants, which only the machine records.
	Trigger string
	// MessageID is the message the action concerns, if any.
	MessageID string
	// Operator and Reason are required: who did it and why.
	Operator string
	Reason   string
	// Detail is appended to the reason in the audit note.
	Detail string
}

// NoteTx records n in the instance's audit trail in the caller's
// transaction, with the instance's current state as from and to and its
// current version, and returns the instance's status. It locks the instance
// row (FOR UPDATE), so the note is ordered with the transitions around it.
func (e *Engine) NoteTx(ctx context.Context, tx pgx.Tx, n Note) (Status, error) {
	var errs []error
	if _, err := uuid.Parse(n.SagaID); err != nil {
		errs = append(errs, fmt.Errorf("saga id %q is not a UUID", n.SagaID))
	}
	switch n.Trigger {
	case "", sagadef.TriggerStart, sagadef.TriggerTimeout, sagadef.TriggerDeadline, sagadef.TriggerStuck,
		sagadef.TriggerOperatorRetry, sagadef.TriggerOperatorCompensate,
		sagadef.TriggerOperatorResolve, sagadef.TriggerOperatorCancel:
		errs = append(errs, fmt.Errorf("note trigger %q is empty or reserved for the state machine", n.Trigger))
	}
	if strings.TrimSpace(n.Operator) == "" {
		errs = append(errs, errors.New("Operator is required"))
	}
	if strings.TrimSpace(n.Reason) == "" {
		errs = append(errs, errors.New("Reason is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return Status{}, fmt.Errorf("saga %s note: %w", e.def.Name, err)
	}
	if err := txq.Sync(ctx, tx); err != nil { // called from a handler that moved the saga
		return Status{}, err
	}
	w, err := e.loadIn(ctx, tx, e.q.lockByID, n.SagaID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Status{}, fmt.Errorf("%s saga %s %s: %w", n.Trigger, e.def.Name, n.SagaID, err)
		}
		return Status{}, fmt.Errorf("%s: lock saga %s: %w", n.Trigger, n.SagaID, err)
	}
	text := withReason(strings.TrimSpace(n.Reason), n.Detail)
	if err := e.audit(ctx, tx, auditEntry{
		SagaID: w.ID, From: w.State, To: w.State, Trigger: n.Trigger, Class: sagadef.ClassNew.String(),
		MessageID: n.MessageID, Operator: n.Operator, Note: text, Version: w.Version,
	}); err != nil {
		return Status{}, err
	}
	return e.status(w)
}

// Ident is an instance's identity and state, as operator views show it
// beside a row that names the saga (a parked message, an operator action).
type Ident struct {
	ID, BusinessKey, State string
}

// Idents returns the instances whose id is one of ids (UUIDs) or whose
// business key is one of keys; either list may be empty. An instance named
// both ways is returned twice.
func (e *Engine) Idents(ctx context.Context, ids, keys []string) ([]Ident, error) {
	if ids == nil {
		ids = []string{}
	}
	if keys == nil {
		keys = []string{}
	}
	rows, err := e.cfg.Pool.Query(ctx, `SELECT id::text, business_key, state FROM `+e.table+` WHERE id = ANY($1::uuid[])
UNION ALL SELECT id::text, business_key, state FROM `+e.table+` WHERE business_key = ANY($2)`, ids, keys)
	if err != nil {
		return nil, fmt.Errorf("saga %s: identify %d ids and %d business keys: %w", e.def.Name, len(ids), len(keys), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Ident])
	if err != nil {
		return nil, fmt.Errorf("saga %s: identify %d ids and %d business keys: %w", e.def.Name, len(ids), len(keys), err)
	}
	return out, nil
}
