package dbossaga

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/bench/internal/benv"
	commonv1 "github.com/protosaga/saga/examples/placeorder/shop/common/v1"
	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
)

// TestSaga runs the DBOS saga on the real PostgreSQL: an order that
// completes, one whose reservation is refused, and one whose last step fails
// for good and is compensated in reverse order, each checked in the
// business tables.
func TestSaga(t *testing.T) {
	if os.Getenv(benv.EnvPostgresURL) == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: run under scripts/with-services.sh", benv.EnvPostgresURL)
		}
		t.Skipf("%s is not set: source /tmp/saga-services/env.sh (or run under scripts/with-services.sh)", benv.EnvPostgresURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := benv.FromEnv(ctx)
	require.NoError(t, err)
	defer env.Close()
	sc, err := env.NewSchema(ctx, "dbostest")
	require.NoError(t, err)
	defer sc.Drop()
	pool, err := sc.Pool(ctx, 8)
	require.NoError(t, err)
	defer pool.Close()
	check, err := sc.Pool(ctx, 2)
	require.NoError(t, err)
	defer check.Close()

	s, err := New(ctx, Config{Pool: pool, Schema: sc.Name, Concurrency: 4, Poll: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = check.Exec(ctx, `INSERT INTO inventory_stock (product_id, available) VALUES ('p-1', 10)`)
	require.NoError(t, err)
	// The approval of order "approve-fails" exists already: its last step
	// fails on the primary key every time.
	_, err = check.Exec(ctx, `INSERT INTO order_approvals (order_id) VALUES ('approve-fails')`)
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(runCtx) }()
	defer func() { stop(); <-runErr }()

	order := func(id string, quantity int32) *orderv1.PlaceOrderRequest {
		return &orderv1.PlaceOrderRequest{OrderId: id, Lines: []*commonv1.OrderLine{{ProductId: "p-1", Quantity: quantity}},
			Amount: &commonv1.Money{Currency: "EUR", MinorUnits: 100}, ShippingAddress: &commonv1.Address{Country: "FR"}}
	}
	require.NoError(t, s.StartBatch(ctx, pool, []*orderv1.PlaceOrderRequest{order("ok", 2), order("refused", 50)}))
	require.NoError(t, s.Start(ctx, order("approve-fails", 3)))

	result := func(id string) (dbos.WorkflowStatusType, error) {
		h, err := dbos.RetrieveWorkflow[string](s.dctx, id)
		require.NoError(t, err)
		_, werr := h.GetResult(dbos.WithHandleTimeout(time.Minute))
		st, err := h.GetStatus()
		require.NoError(t, err)
		return st.Status, werr
	}
	effects := func(id string) []string {
		rows, err := check.Query(ctx, `SELECT effect FROM shop_ledger WHERE order_id = $1 ORDER BY id`, id)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}

	st, err := result("ok")
	require.NoError(t, err)
	require.Equal(t, dbos.WorkflowStatusSuccess, st)
	require.Equal(t, []string{"reserved", "authorized", "booked", "approved"}, effects("ok"))

	st, err = result("refused")
	require.ErrorContains(t, err, "out of stock: p-1")
	require.Equal(t, dbos.WorkflowStatusError, st)
	require.Equal(t, []string{"reservation_refused"}, effects("refused"))

	st, err = result("approve-fails")
	require.ErrorContains(t, err, "order: approve order approve-fails")
	require.Equal(t, dbos.WorkflowStatusError, st)
	require.Equal(t, []string{"reserved", "authorized", "booked", "cancelled", "voided", "released"}, effects("approve-fails"))

	var available, authorizations, shipments int
	require.NoError(t, check.QueryRow(ctx, `SELECT available FROM inventory_stock WHERE product_id = 'p-1'`).Scan(&available))
	require.Equal(t, 8, available, "the completed order holds 2; the compensated one gave its 3 back")
	require.NoError(t, check.QueryRow(ctx, `SELECT (SELECT count(*) FROM payment_authorizations), (SELECT count(*) FROM shipping_shipments)`).
		Scan(&authorizations, &shipments))
	require.Equal(t, [2]int{1, 1}, [2]int{authorizations, shipments}, "only the completed order keeps its authorization and shipment")
}
