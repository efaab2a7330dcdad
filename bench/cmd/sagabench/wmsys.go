package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/protosaga/saga/bench/internal/benv"
	"github.com/protosaga/saga/bench/internal/wm"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// wmSystem is the Watermill saga on a fresh schema and vhost.
type wmSystem struct {
	infra
	saga *wm.Saga
}

func newWM(ctx context.Context, env *benv.Env, queueType string, logger *slog.Logger) (*wmSystem, error) {
	s := &wmSystem{}
	var err error
	if s.schema, err = env.NewSchema(ctx, "wm"); err != nil {
		return nil, err
	}
	if s.vhost, err = env.NewVHost(ctx, "wm"); err != nil {
		s.Close()
		return nil, err
	}
	// 8 handlers + 5 forwarders each hold at most one connection; the rest
	// is headroom for starts and polls.
	if s.pool, err = s.schema.Pool(ctx, 24, &s.stmts); err != nil {
		s.Close()
		return nil, err
	}
	if s.saga, err = wm.New(ctx, wm.Config{Pool: s.pool, AMQPURL: s.vhost.URL, QueueType: queueType, Logger: logger}); err != nil {
		s.Close()
		return nil, err
	}
	if err := wm.Restock(ctx, s.pool); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *wmSystem) StartBatch(ctx context.Context, reqs []*orderv1.PlaceOrderRequest) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, r := range reqs {
			if err := wm.StartTx(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *wmSystem) Start(ctx context.Context, req *orderv1.PlaceOrderRequest) error {
	return s.saga.Start(ctx, req)
}

func (s *wmSystem) Run(ctx context.Context) error { return s.saga.Run(ctx) }

func (s *wmSystem) StepsDone(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(reserved_at) + count(authorized_at) + count(shipped_at) + count(approved_at) FROM wm_saga`)
}

func (s *wmSystem) Unhappy(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM wm_saga WHERE state = 'FAILED'`)
}

func (s *wmSystem) Completed(ctx context.Context) (int, error) {
	return countQuery(ctx, s.pool, `SELECT count(*) FROM wm_saga WHERE state = '`+wm.StateCompleted+`'`)
}

func (s *wmSystem) Latencies(ctx context.Context) (latency, error) {
	return latencyQuery(ctx, s.pool, `
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT extract(epoch FROM reserved_at - created_at) AS s FROM wm_saga WHERE state = 'COMPLETED'
  UNION ALL SELECT extract(epoch FROM authorized_at - reserved_at) FROM wm_saga WHERE state = 'COMPLETED'
  UNION ALL SELECT extract(epoch FROM shipped_at - authorized_at) FROM wm_saga WHERE state = 'COMPLETED'
  UNION ALL SELECT extract(epoch FROM approved_at - shipped_at) FROM wm_saga WHERE state = 'COMPLETED') d`,
		`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s) FROM (
  SELECT extract(epoch FROM approved_at - created_at) AS s FROM wm_saga WHERE state = 'COMPLETED') d`)
}

func (s *wmSystem) Close() {
	if s.saga != nil {
		s.saga.Close()
	}
	s.close()
}

// wmErrors reports handler failures, which a correct run has none of.
func (s *wmSystem) errors() error {
	if n := s.saga.Errors(); n > 0 {
		return fmt.Errorf("watermill saga: %d handler attempts failed", n)
	}
	return nil
}
