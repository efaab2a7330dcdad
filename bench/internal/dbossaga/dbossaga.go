// Package dbossaga is the Place Order saga built the way a competent DBOS
// user would build it (github.com/dbos-inc/dbos-transact-golang), to compare
// with the saga runtime in the same run: one durable workflow whose four
// steps do the participants' SQL (package shop), started through a DBOS
// queue, on the same PostgreSQL.
//
// # Shape
//
// PlaceOrder runs ReserveInventory, AuthorizePayment, ScheduleShipping and
// ApproveOrder as DBOS transactions (dbos.RunAsTransaction) on a data source
// that is the DBOS system database itself: each step's business SQL and its
// checkpoint commit in one transaction, so a step runs exactly once. When a
// step fails for good (a refused reservation, or a step whose retries ran
// out), the compensations of the steps that succeeded run in reverse order
// and the workflow ends in ERROR.
//
// Sagas are enqueued on the "place-order" queue; this process's queue runner
// dequeues them and runs each workflow in a goroutine of its own.
//
// # Tuning (stated, not hidden)
//
//   - Queue: worker concurrency as configured (most workflows this process
//     runs at once), base polling interval as configured (DBOS's default is
//     1 s, which would cap a queue at its concurrency per second).
//   - Steps: 4 retries from 100 ms, backoff 2, at most 5 s apart (DBOS's
//     step retry options); transient database errors are retried by DBOS.
//   - Inputs and outputs: DBOS's default JSON serializer.
//   - One pgx pool serves DBOS's system tables and the steps' SQL.
package dbossaga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protosaga/saga/bench/internal/shop"
	"github.com/protosaga/saga/examples/placeorder/app"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/runtime/schema"
)

// QueueName is the queue sagas are enqueued on.
const QueueName = "place-order"

// WorkflowName is the workflow's registered name.
const WorkflowName = "PlaceOrder"

// Config configures the DBOS saga.
type Config struct {
	Pool        *pgxpool.Pool // on a fresh schema; DBOS's system tables go to the same schema
	Schema      string
	Concurrency int           // the queue's worker concurrency
	Poll        time.Duration // the queue's base polling interval
	Logger      *slog.Logger
}

// Saga is the DBOS saga in this process.
type Saga struct {
	cfg      Config
	dctx     dbos.Context
	ds       *dbos.DataSource
	queue    dbos.Queue
	launched chan struct{}
}

// New creates the participants' tables, the DBOS context (which migrates
// DBOS's system tables), the data source, the workflow and the queue. Sagas
// may be started once Run has launched DBOS.
func New(ctx context.Context, cfg Config) (*Saga, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := schema.Migrate(ctx, cfg.Pool, app.Migrations()); err != nil {
		return nil, fmt.Errorf("dbos saga: migrate shop tables: %w", err)
	}
	s := &Saga{cfg: cfg, launched: make(chan struct{})}
	var err error
	s.dctx, err = dbos.NewContext(ctx, dbos.Config{
		AppName: "placeorder", SystemDBPool: cfg.Pool, DatabaseSchema: cfg.Schema, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("dbos saga: new context: %w", err)
	}
	// The same pool as the system database: a step's SQL and its checkpoint
	// commit in one transaction.
	if s.ds, err = dbos.NewDataSource(s.dctx, cfg.Pool); err != nil {
		return nil, fmt.Errorf("dbos saga: data source: %w", err)
	}
	dbos.RegisterWorkflow(s.dctx, s.placeOrder, dbos.WithWorkflowName(WorkflowName))
	if s.queue, err = dbos.RegisterQueue(s.dctx, QueueName,
		dbos.WithWorkerConcurrency(cfg.Concurrency), dbos.WithQueueBasePollingInterval(cfg.Poll)); err != nil {
		return nil, fmt.Errorf("dbos saga: register queue: %w", err)
	}
	return s, nil
}

// StartBatch enqueues the sagas of reqs in one transaction.
func (s *Saga) StartBatch(ctx context.Context, pool *pgxpool.Pool, reqs []*orderv1.PlaceOrderRequest) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, r := range reqs {
			if _, err := dbos.Enqueue[string](s.dctx, QueueName, WorkflowName, shop.FromRequest(r),
				dbos.WithEnqueueWorkflowID(r.GetOrderId()), dbos.WithEnqueueTransaction(tx)); err != nil {
				return fmt.Errorf("dbos saga: enqueue order %s: %w", r.GetOrderId(), err)
			}
		}
		return nil
	})
}

// Start enqueues one saga.
func (s *Saga) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	if _, err := dbos.RunWorkflow(s.dctx, s.placeOrder, shop.FromRequest(req),
		dbos.WithQueue(s.queue), dbos.WithWorkflowID(req.GetOrderId())); err != nil {
		return fmt.Errorf("dbos saga: enqueue order %s: %w", req.GetOrderId(), err)
	}
	return nil
}

func (s *Saga) wait(ctx context.Context) error {
	select {
	case <-s.launched:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run launches DBOS (queue runner, recovery) and shuts it down when ctx is
// cancelled.
func (s *Saga) Run(ctx context.Context) error {
	if err := dbos.Launch(s.dctx); err != nil {
		return fmt.Errorf("dbos saga: launch: %w", err)
	}
	close(s.launched)
	<-ctx.Done()
	if err := dbos.Shutdown(s.dctx, 10*time.Second); err != nil {
		return fmt.Errorf("dbos saga: shutdown: %w", err)
	}
	return ctx.Err()
}

// errRefused marks a business refusal, which is not retried.
var errRefused = errors.New("refused")

func stepOptions() []dbos.StepOption {
	return []dbos.StepOption{
		dbos.WithStepMaxRetries(4), dbos.WithStepBaseInterval(100 * time.Millisecond),
		dbos.WithStepBackoffFactor(2), dbos.WithStepMaxInterval(5 * time.Second),
		dbos.WithStepRetryPredicate(func(err error) bool { return !errors.Is(err, errRefused) }),
	}
}

// txn runs fn as a DBOS transaction (business SQL and checkpoint in one
// commit).
func (s *Saga) txn(ctx dbos.Context, fn func(ctx context.Context, db shop.DB) error) error {
	_, err := dbos.RunAsTransaction(ctx, s.ds, func(ctx context.Context, tx dbos.Tx) (bool, error) {
		return true, fn(ctx, dbosDB{tx})
	}, stepOptions()...)
	return err
}

// placeOrder is the saga's workflow.
func (s *Saga) placeOrder(ctx dbos.Context, o shop.Order) (string, error) {
	refused, err := dbos.RunAsTransaction(ctx, s.ds, func(ctx context.Context, tx dbos.Tx) (string, error) {
		return shop.Reserve(ctx, dbosDB{tx}, o)
	}, stepOptions()...)
	if err != nil {
		return "", err
	}
	if refused != "" {
		return "", fmt.Errorf("order %s: %w: %s", o.OrderID, errRefused, refused)
	}
	var compensations []func(ctx context.Context, db shop.DB) error
	fail := func(err error) (string, error) {
		for i := len(compensations) - 1; i >= 0; i-- {
			if cerr := s.txn(ctx, compensations[i]); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
		return "", err
	}
	compensations = append(compensations, func(ctx context.Context, db shop.DB) error { return shop.Release(ctx, db, o.OrderID) })
	if err := s.txn(ctx, func(ctx context.Context, db shop.DB) error { _, err := shop.Authorize(ctx, db, o); return err }); err != nil {
		return fail(err)
	}
	compensations = append(compensations, func(ctx context.Context, db shop.DB) error { return shop.Void(ctx, db, o.OrderID) })
	if err := s.txn(ctx, func(ctx context.Context, db shop.DB) error { _, err := shop.Schedule(ctx, db, o); return err }); err != nil {
		return fail(err)
	}
	compensations = append(compensations, func(ctx context.Context, db shop.DB) error { return shop.CancelShipment(ctx, db, o.OrderID) })
	if err := s.txn(ctx, func(ctx context.Context, db shop.DB) error { return shop.Approve(ctx, db, o.OrderID) }); err != nil {
		return fail(err)
	}
	return o.OrderID, nil
}

// dbosDB adapts a DBOS transaction.
type dbosDB struct{ tx dbos.Tx }

func (d dbosDB) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	res, err := d.tx.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d dbosDB) Query(ctx context.Context, sql string, args ...any) (shop.Rows, error) {
	return d.tx.Query(ctx, sql, args...)
}
