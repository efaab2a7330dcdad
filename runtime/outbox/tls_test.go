package outbox

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/protosaga/saga/internal/testenv"
	"github.com/protosaga/saga/runtime/broker"
	"github.com/protosaga/saga/runtime/schema"
)

// TestOverTLS runs the outbox path with every connection encrypted and
// verified: PostgreSQL with sslmode=verify-full, RabbitMQ over amqps:// with
// the test CA as the only root. Rows committed through a TLS pool are
// published by a relay on a TLS broker connection and consumed over TLS.
func TestOverTLS(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)

	pool, err := pgxpool.New(ctx, testenv.PostgresTLSURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var encrypted bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&encrypted))
	require.True(t, encrypted, "the pool's connections are TLS")
	require.NoError(t, schema.Migrate(ctx, pool))

	url, tlsConf := testenv.AMQPSURL(t), testenv.TLSConfig(t)
	dial := func(name string) *broker.Conn {
		c, err := broker.Dial(ctx, url, broker.ConnConfig{Name: name, TLS: tlsConf, MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	b := &testBundle{pool: pool, amqpURL: url, conn: dial("relay"), consumer: dial("consumer")}
	b.ch, err = b.consumer.Channel(ctx)
	require.NoError(t, err)
	require.NoError(t, broker.Declare(ctx, b.ch, broker.Topology{
		Exchanges: []broker.Exchange{{Name: testExchange}},
		Queues:    []broker.Queue{{Name: testQueue, Type: broker.QueueClassic}},
		Bindings:  []broker.Binding{{Queue: testQueue, Exchange: testExchange, RoutingKey: "order.*"}},
	}))
	deliveries, err := b.ch.Consume(testQueue, "", true, false, false, false, nil)
	require.NoError(t, err)

	ids := enqueue(t, ctx, pool, 20, routedKey)
	startRelay(t, b, RelayConfig{})
	seen := map[string]bool{}
	for len(seen) < len(ids) {
		select {
		case d := <-deliveries:
			seen[d.MessageId] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d messages arrived over TLS", len(seen), len(ids))
		}
	}
	for _, id := range ids {
		require.True(t, seen[id], id)
	}
	waitUnpublished(t, ctx, pool, 0)
}

// TestTLSRefusesUnknownCA: a broker certificate no configured root vouches
// for fails the dial at once with a certificate error (no retry loop), and
// PostgreSQL's verify-full refuses a server whose CA is not given.
func TestTLSRefusesUnknownCA(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := broker.Dial(ctx, testenv.AMQPSURL(t), broker.ConnConfig{TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	require.Error(t, err)
	require.ErrorContains(t, err, "certificate")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "a bad certificate is not retried until the deadline")

	withoutCA := testenv.PostgresTLSURL(t)
	cfg, err := pgxpool.ParseConfig(withoutCA)
	require.NoError(t, err)
	cfg.ConnConfig.TLSConfig.RootCAs = nil // system roots: the test CA is not among them
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	err = pool.Ping(ctx)
	require.Error(t, err)
	require.ErrorContains(t, err, "certificate")
}
