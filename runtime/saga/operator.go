package saga

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/runtime/internal/txq"
	"github.com/protosaga/saga/runtime/sagadef"
	"github.com/protosaga/saga/runtime/telemetry"
)

// Operation is an operator's repair of one instance. Every operation is
// version-guarded and audited with who did it and why.
type Operation struct {
	// Trigger is one of sagadef.TriggerOperatorRetry,
	// TriggerOperatorCompensate, TriggerOperatorResolve or
	// TriggerOperatorCancel.
	Trigger string
	SagaID  string
	// ExpectedVersion is the version the operator decided on (from
	// [Status]). If the instance has moved on, the operation fails with a
	// [*VersionConflictError] and changes nothing.
	ExpectedVersion int64
	// Operator and Reason are required: every repair records who and why.
	Operator string
	Reason   string
	// ResolveTo is the target state of TriggerOperatorResolve.
	ResolveTo string
}

func (op Operation) validate() error {
	var errs []error
	switch op.Trigger {
	case sagadef.TriggerOperatorRetry, sagadef.TriggerOperatorCompensate, sagadef.TriggerOperatorCancel:
		if op.ResolveTo != "" {
			errs = append(errs, fmt.Errorf("ResolveTo is only for %s", sagadef.TriggerOperatorResolve))
		}
	case sagadef.TriggerOperatorResolve:
		if op.ResolveTo == "" {
			errs = append(errs, errors.New("ResolveTo is required"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown operator trigger %q", op.Trigger))
	}
	if _, err := uuid.Parse(op.SagaID); err != nil {
		errs = append(errs, fmt.Errorf("saga id %q is not a UUID", op.SagaID))
	}
	if op.ExpectedVersion <= 0 {
		errs = append(errs, errors.New("ExpectedVersion is required"))
	}
	if strings.TrimSpace(op.Operator) == "" {
		errs = append(errs, errors.New("Operator is required"))
	}
	if strings.TrimSpace(op.Reason) == "" {
		errs = append(errs, errors.New("Reason is required"))
	}
	return errors.Join(errs...)
}

// target is the state an operation ends in when its result does not depend
// on the machine: repeating it is a no-op.
func (op Operation) target() string {
	switch op.Trigger {
	case sagadef.TriggerOperatorCancel:
		return sagadef.StateCancelled
	case sagadef.TriggerOperatorResolve:
		return op.ResolveTo
	}
	return ""
}

// OperateTx applies op in the caller's transaction: it locks the instance,
// checks the expected version, applies the operator trigger through the state
// machine, and persists, outboxes and audits the result like any transition.
//
// Cancel and Resolve are idempotent: when the instance already is in the
// requested terminal state, OperateTx returns its status and changes nothing,
// whatever ExpectedVersion says (a repeated click is not a conflict). Retry and
// Compensate are never repeated blindly: the version guard refuses the second.
//
// Errors: ErrNotFound, [*VersionConflictError] (errors.Is ErrVersionConflict)
// when the instance has moved on, [*RejectedError] (errors.Is ErrRejected)
// when the machine does not allow the operation in the current state.
func (e *Engine) OperateTx(ctx context.Context, tx pgx.Tx, op Operation) (Status, error) {
	if err := op.validate(); err != nil {
		return Status{}, fmt.Errorf("saga %s operation: %w", e.def.Name, err)
	}
	if op.Trigger == sagadef.TriggerOperatorResolve {
		if _, ok := e.stateKind[op.ResolveTo]; !ok {
			return Status{}, fmt.Errorf("saga %s operation: resolve to unknown state %q", e.def.Name, op.ResolveTo)
		}
	}
	if err := txq.Sync(ctx, tx); err != nil { // called from a handler that moved the saga
		return Status{}, err
	}
	w, err := e.loadIn(ctx, tx, e.q.lockByID, op.SagaID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Status{}, fmt.Errorf("%s saga %s %s: %w", op.Trigger, e.def.Name, op.SagaID, err)
		}
		return Status{}, fmt.Errorf("%s: lock saga %s: %w", op.Trigger, op.SagaID, err)
	}
	if t := op.target(); t != "" && w.State == t && e.isTerminal(t) {
		return e.status(w)
	}
	if w.Version != op.ExpectedVersion {
		return Status{}, &VersionConflictError{SagaID: w.ID, Expected: op.ExpectedVersion, Actual: w.Version, State: w.State}
	}
	trig := sagadef.Trigger{Kind: op.Trigger, Operator: op.Operator, Reason: op.Reason, ResolveTo: op.ResolveTo}
	inst, err := e.instanceFor(w, op.Trigger)
	if errors.Is(err, ErrUnreadableData) {
		return Status{}, &RejectedError{SagaID: w.ID, State: w.State, Trigger: op.Trigger,
			Err: fmt.Errorf("%w; %s", err, UnreadableDataHint)}
	}
	if err != nil {
		return Status{}, err
	}
	res, err := e.def.Apply(ctx, e.env(), inst, trig)
	if errors.Is(err, sagadef.ErrInvalidTrigger) || errors.Is(err, sagadef.ErrTerminal) {
		return Status{}, &RejectedError{SagaID: w.ID, State: w.State, Trigger: op.Trigger, Err: err}
	}
	if err != nil {
		return Status{}, fmt.Errorf("apply %s to saga %s in state %s: %w", op.Trigger, w.ID, w.State, err)
	}
	if res.Class != sagadef.ClassNew {
		return Status{}, &RejectedError{SagaID: w.ID, State: w.State, Trigger: op.Trigger,
			Err: fmt.Errorf("classified %s: %s", res.Class, res.Note)}
	}
	ctx, span := e.tel.startTransition(ctx, telemetry.SpanOperate, w, trig, origin{})
	span = withOperator(span, op.Operator)
	out, err := e.persist(ctx, tx, w, res, trig, origin{})
	if err == nil {
		// persist may only have queued the writes (in a handler's or an
		// operator's scope): send them before the span ends and the
		// action is logged, so that a failed write shows in both.
		err = txq.Sync(ctx, tx)
	}
	e.tel.endTransition(ctx, tx, span, w, trig, origin{}, out, err)
	if err != nil {
		return Status{}, err
	}
	e.cfg.Logger.InfoContext(ctx, "saga operator action", "saga_type", e.def.Name, "saga_id", w.ID,
		"trigger", op.Trigger, "operator", op.Operator, "from", w.State, "to", res.Instance.State, "version", out.Version)
	after, err := e.loadIn(ctx, tx, e.q.selectByID, w.ID)
	if err != nil {
		return Status{}, fmt.Errorf("%s: reload saga %s: %w", op.Trigger, w.ID, err)
	}
	return e.status(after)
}

// Operate is [Engine.OperateTx] in a transaction of its own. Like
// [Engine.Start], it counts the action in the metrics only once it has
// committed, and hands the commands it sends to the engine's relay
// ([Engine.HandOffTo]) or wakes relays after the commit.
func (e *Engine) Operate(ctx context.Context, op Operation) (Status, error) {
	var st Status
	err := e.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		st, err = e.OperateTx(ctx, tx, op)
		return err
	})
	return st, err
}

// Retry resends the current step's command (or compensation) of an instance,
// typically one in manual review after its retry budget ran out.
func (e *Engine) Retry(ctx context.Context, sagaID string, expectedVersion int64, operator, reason string) (Status, error) {
	return e.Operate(ctx, Operation{Trigger: sagadef.TriggerOperatorRetry, SagaID: sagaID,
		ExpectedVersion: expectedVersion, Operator: operator, Reason: reason})
}

// Compensate forces compensation of the instance's completed compensatable
// steps, in reverse order.
func (e *Engine) Compensate(ctx context.Context, sagaID string, expectedVersion int64, operator, reason string) (Status, error) {
	return e.Operate(ctx, Operation{Trigger: sagadef.TriggerOperatorCompensate, SagaID: sagaID,
		ExpectedVersion: expectedVersion, Operator: operator, Reason: reason})
}

// Resolve moves an instance (typically in manual review) to state to, for
// example COMPLETED after an operator finished the work by hand.
func (e *Engine) Resolve(ctx context.Context, sagaID string, expectedVersion int64, to, operator, reason string) (Status, error) {
	return e.Operate(ctx, Operation{Trigger: sagadef.TriggerOperatorResolve, SagaID: sagaID,
		ExpectedVersion: expectedVersion, Operator: operator, Reason: reason, ResolveTo: to})
}

// Cancel ends an instance in CANCELLED without compensating. Use Compensate
// first when effects must be undone.
func (e *Engine) Cancel(ctx context.Context, sagaID string, expectedVersion int64, operator, reason string) (Status, error) {
	return e.Operate(ctx, Operation{Trigger: sagadef.TriggerOperatorCancel, SagaID: sagaID,
		ExpectedVersion: expectedVersion, Operator: operator, Reason: reason})
}
