package testenv_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
)

func TestPostgresSchemasAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.Postgres(t), testenv.Postgres(t)
	_, err := a.Exec(ctx, `CREATE TABLE things (id int)`)
	require.NoError(t, err)
	_, err = a.Exec(ctx, `INSERT INTO things VALUES (1)`)
	require.NoError(t, err)
	// The same unqualified name in the other schema does not exist.
	_, err = b.Exec(ctx, `SELECT * FROM things`)
	require.Error(t, err)
	var path string
	require.NoError(t, a.QueryRow(ctx, `SHOW search_path`).Scan(&path))
	require.Contains(t, path, "t_")
}

func TestKillPostgresConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, conn.Ping(ctx))
	require.GreaterOrEqual(t, testenv.KillPostgresConnections(t, pool), 1)
	require.Error(t, conn.Ping(ctx), "a terminated backend must fail its next use")
}

func TestAMQPVhostsAreIsolatedAndConnectionsCanBeKilled(t *testing.T) {
	t.Parallel()
	urlA, urlB := testenv.AMQP(t), testenv.AMQP(t)
	require.NotEqual(t, urlA, urlB)

	connA, err := amqp.Dial(urlA)
	require.NoError(t, err)
	defer connA.Close()
	chA, err := connA.Channel()
	require.NoError(t, err)
	_, err = chA.QueueDeclare("work", true, false, false, false, nil)
	require.NoError(t, err)

	connB, err := amqp.Dial(urlB)
	require.NoError(t, err)
	defer connB.Close()
	chB, err := connB.Channel()
	require.NoError(t, err)
	_, err = chB.QueueDeclarePassive("work", true, false, false, false, nil)
	require.Error(t, err, "a queue of one vhost must not exist in another")

	closed := connA.NotifyClose(make(chan *amqp.Error, 1))
	require.GreaterOrEqual(t, testenv.KillAMQPConnections(t, urlA), 1)
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("connection was not closed by KillAMQPConnections")
	}
	require.False(t, connB.IsClosed(), "killing one vhost's connections must spare the others")
}
