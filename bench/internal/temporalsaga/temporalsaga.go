// Package temporalsaga is the Place Order saga built the way a competent
// Temporal user would build it, to compare with the saga runtime in the same
// run: one workflow, four activities doing the participants' SQL (package
// shop), compensations on failure, activity retries, a Go SDK worker.
//
// # Shape
//
// PlaceOrder runs ReserveInventory, AuthorizePayment, ScheduleShipping and
// ApproveOrder one after the other. When a step fails for good (a business
// refusal, which is not retried, or a step whose retries ran out), the
// compensations of the steps that succeeded run in reverse order
// (ReleaseInventory, VoidPayment, CancelShipment) and the workflow fails.
//
// Activities are at least once: an activity whose transaction committed may
// run again when its completion does not reach the server. Each activity
// therefore claims its (workflow, activity) key in an inbox table
// (tp_done) in the same transaction as its effect; a repeat finds the key
// and does nothing, the same shape as the Watermill build's inbox.
//
// # Tuning (stated, not hidden)
//
//   - Activities: start-to-close timeout 10 s; retries from 100 ms, backoff 2,
//     at most 10 s apart, 5 attempts; an out-of-stock refusal is not retried.
//   - Worker: workflow-task and activity-task pollers as configured (the SDK
//     default is 2 each), the SDK's default executor slots (1,000 each),
//     sticky execution and eager activity dispatch on (the defaults).
//   - Activities' PostgreSQL pool: 20 connections.
//
// The Temporal server (Server) persists to PostgreSQL with its own schema,
// applied by its own schema tool.
package temporalsaga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/protosaga/saga/bench/internal/shop"
	"github.com/protosaga/saga/examples/placeorder/app"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/runtime/schema"
)

// TaskQueue is the task queue of the workflow and its activities.
const TaskQueue = "place-order"

// errOutOfStock is the application error type of a refused reservation.
const errOutOfStock = "OutOfStock"

const tables = `CREATE TABLE tp_done (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`

// Config configures the saga's worker and client.
type Config struct {
	Pool      *pgxpool.Pool // the participants' tables, on a fresh schema
	HostPort  string        // the Temporal frontend
	Namespace string
	Pollers   int          // workflow-task and activity-task pollers each; 0 = the SDK default (2)
	Logger    *slog.Logger // SDK warnings and errors; default slog.Default()
}

// Saga is the client and worker of the Temporal saga.
type Saga struct {
	cfg    Config
	client client.Client
	worker worker.Worker
}

// New creates the participants' tables and the inbox table, connects to the
// server and builds the worker. Workflows may be started once New returns;
// none runs until Run.
func New(ctx context.Context, cfg Config) (*Saga, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := schema.Migrate(ctx, cfg.Pool, app.Migrations()); err != nil {
		return nil, fmt.Errorf("temporal saga: migrate shop tables: %w", err)
	}
	if _, err := cfg.Pool.Exec(ctx, tables); err != nil {
		return nil, fmt.Errorf("temporal saga: create inbox table: %w", err)
	}
	c, err := client.DialContext(ctx, client.Options{
		HostPort: cfg.HostPort, Namespace: cfg.Namespace,
		Logger: tlog.NewStructuredLogger(cfg.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("temporal saga: dial %s: %w", cfg.HostPort, err)
	}
	w := worker.New(c, TaskQueue, worker.Options{
		MaxConcurrentWorkflowTaskPollers: cfg.Pollers,
		MaxConcurrentActivityTaskPollers: cfg.Pollers,
	})
	w.RegisterWorkflow(PlaceOrder)
	w.RegisterActivity(&Activities{Pool: cfg.Pool})
	return &Saga{cfg: cfg, client: c, worker: w}, nil
}

// Start starts the saga of req; the workflow id is the order id.
func (s *Saga) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	if _, err := s.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: req.GetOrderId(), TaskQueue: TaskQueue},
		PlaceOrder, shop.FromRequest(req)); err != nil {
		return fmt.Errorf("temporal saga: start order %s: %w", req.GetOrderId(), err)
	}
	return nil
}

// Run runs the worker until ctx is cancelled.
func (s *Saga) Run(ctx context.Context) error {
	if err := s.worker.Start(); err != nil {
		return fmt.Errorf("temporal saga: start worker: %w", err)
	}
	<-ctx.Done()
	s.worker.Stop()
	return ctx.Err()
}

// Close closes the client.
func (s *Saga) Close() { s.client.Close() }

// PlaceOrder is the saga's workflow.
func PlaceOrder(ctx workflow.Context, o shop.Order) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second,
			MaximumAttempts: 5, NonRetryableErrorTypes: []string{errOutOfStock},
		},
	})
	var a *Activities
	var compensations []any // activities, run in reverse order when a later step fails
	fail := func(err error) error {
		for i := len(compensations) - 1; i >= 0; i-- {
			if cerr := workflow.ExecuteActivity(ctx, compensations[i], o.OrderID).Get(ctx, nil); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
		return err
	}
	if err := workflow.ExecuteActivity(ctx, a.ReserveInventory, o).Get(ctx, nil); err != nil {
		return err // nothing was reserved
	}
	compensations = append(compensations, a.ReleaseInventory)
	if err := workflow.ExecuteActivity(ctx, a.AuthorizePayment, o).Get(ctx, nil); err != nil {
		return fail(err)
	}
	compensations = append(compensations, a.VoidPayment)
	if err := workflow.ExecuteActivity(ctx, a.ScheduleShipping, o).Get(ctx, nil); err != nil {
		return fail(err)
	}
	compensations = append(compensations, a.CancelShipment)
	if err := workflow.ExecuteActivity(ctx, a.ApproveOrder, o.OrderID).Get(ctx, nil); err != nil {
		return fail(err)
	}
	return nil
}

// Activities are the saga's steps and compensations.
type Activities struct {
	Pool *pgxpool.Pool
}

// inTx runs fn in one transaction after claiming the activity's
// (workflow, activity type) key; a key already claimed means an earlier
// attempt committed, and fn does not run again.
func (a *Activities) inTx(ctx context.Context, fn func(db shop.DB) error) error {
	info := activity.GetInfo(ctx)
	key := info.WorkflowExecution.ID + "/" + info.ActivityType.Name
	return pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO tp_done (key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
		if err != nil {
			return fmt.Errorf("claim %s: %w", key, err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		return fn(shop.Pgx(tx))
	})
}

// ReserveInventory takes the order's stock; a refusal is not retried.
func (a *Activities) ReserveInventory(ctx context.Context, o shop.Order) error {
	var refused string
	if err := a.inTx(ctx, func(db shop.DB) (err error) {
		refused, err = shop.Reserve(ctx, db, o)
		return err
	}); err != nil {
		return err
	}
	if refused != "" {
		return temporal.NewNonRetryableApplicationError(refused, errOutOfStock, nil)
	}
	return nil
}

// ReleaseInventory compensates ReserveInventory.
func (a *Activities) ReleaseInventory(ctx context.Context, orderID string) error {
	return a.inTx(ctx, func(db shop.DB) error { return shop.Release(ctx, db, orderID) })
}

// AuthorizePayment authorizes the order's amount.
func (a *Activities) AuthorizePayment(ctx context.Context, o shop.Order) error {
	return a.inTx(ctx, func(db shop.DB) error { _, err := shop.Authorize(ctx, db, o); return err })
}

// VoidPayment compensates AuthorizePayment.
func (a *Activities) VoidPayment(ctx context.Context, orderID string) error {
	return a.inTx(ctx, func(db shop.DB) error { return shop.Void(ctx, db, orderID) })
}

// ScheduleShipping books the shipment.
func (a *Activities) ScheduleShipping(ctx context.Context, o shop.Order) error {
	return a.inTx(ctx, func(db shop.DB) error { _, err := shop.Schedule(ctx, db, o); return err })
}

// CancelShipment compensates ScheduleShipping.
func (a *Activities) CancelShipment(ctx context.Context, orderID string) error {
	return a.inTx(ctx, func(db shop.DB) error { return shop.CancelShipment(ctx, db, orderID) })
}

// ApproveOrder approves the order.
func (a *Activities) ApproveOrder(ctx context.Context, orderID string) error {
	return a.inTx(ctx, func(db shop.DB) error { return shop.Approve(ctx, db, orderID) })
}
