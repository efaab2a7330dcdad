// Package raw measures the limits of this machine's servers with the
// simplest client that reaches them: persistent publishes with confirms and
// consume+ack straight on amqp091-go, and pgbench running the transaction
// shape of the saga runtime's hot loop. The saga measurements are reported as
// ratios to these.
package raw

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Body is a ~300-byte message body, the size the benchmarks publish.
var Body = func() []byte {
	b := make([]byte, 300)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}()

// declareQueue declares a durable queue of type qt ("quorum" or "classic").
func declareQueue(ch *amqp.Channel, name, qt string) error {
	_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": qt})
	if err != nil {
		return fmt.Errorf("declare %s queue %s: %w", qt, name, err)
	}
	return nil
}

// Rate is a measured rate.
type Rate struct {
	N       int
	Elapsed time.Duration
}

// PerSecond is N/Elapsed.
func (r Rate) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.N) / r.Elapsed.Seconds()
}

// Publish publishes persistent Body messages to a fresh durable queue of type
// qt on amqpURL for duration d, keeping at most window confirms outstanding
// (window 1: wait for each confirm), and returns how many were confirmed and
// how long it took until the last confirm. It stops early after max
// messages when max > 0.
func Publish(ctx context.Context, amqpURL, qt string, window int, d time.Duration, max int) (Rate, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return Rate{}, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Rate{}, fmt.Errorf("channel: %w", err)
	}
	queue := fmt.Sprintf("raw.publish.%s.w%d", qt, window)
	if err := declareQueue(ch, queue, qt); err != nil {
		return Rate{}, err
	}
	return publishTo(ctx, ch, queue, window, d, max)
}

func publishTo(ctx context.Context, ch *amqp.Channel, queue string, window int, d time.Duration, max int) (Rate, error) {
	if window < 1 {
		return Rate{}, fmt.Errorf("window %d: want at least 1", window)
	}
	if err := ch.Confirm(false); err != nil {
		return Rate{}, fmt.Errorf("confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+1))
	pub := amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream", Body: Body}
	start := time.Now()
	deadline := start.Add(d)
	sent, acked, outstanding := 0, 0, 0
	wait := func() error {
		select {
		case c, ok := <-confirms:
			if !ok {
				return errors.New("channel closed while waiting for confirms")
			}
			outstanding--
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
			acked++
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for time.Now().Before(deadline) && (max <= 0 || sent < max) {
		for outstanding < window && (max <= 0 || sent < max) {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, pub); err != nil {
				return Rate{}, fmt.Errorf("publish: %w", err)
			}
			sent++
			outstanding++
		}
		if err := wait(); err != nil {
			return Rate{}, err
		}
	}
	for outstanding > 0 {
		if err := wait(); err != nil {
			return Rate{}, err
		}
	}
	return Rate{N: acked, Elapsed: time.Since(start)}, nil
}

// Consume fills a fresh durable queue of type qt with fill messages (with
// pipelined confirms, not timed), then consumes it with prefetch, acking each
// delivery on its own, until the queue is empty or d has passed.
func Consume(ctx context.Context, amqpURL, qt string, prefetch, fill int, d time.Duration) (Rate, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return Rate{}, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	pch, err := conn.Channel()
	if err != nil {
		return Rate{}, fmt.Errorf("channel: %w", err)
	}
	queue := fmt.Sprintf("raw.consume.%s.p%d", qt, prefetch)
	if err := declareQueue(pch, queue, qt); err != nil {
		return Rate{}, err
	}
	if _, err := publishTo(ctx, pch, queue, 256, time.Hour, fill); err != nil {
		return Rate{}, fmt.Errorf("fill %s: %w", queue, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return Rate{}, fmt.Errorf("channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return Rate{}, fmt.Errorf("qos %d: %w", prefetch, err)
	}
	start := time.Now()
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return Rate{}, fmt.Errorf("consume %s: %w", queue, err)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	n := 0
	for n < fill {
		select {
		case dl, ok := <-deliveries:
			if !ok {
				return Rate{}, errors.New("deliveries closed")
			}
			if err := dl.Ack(false); err != nil {
				return Rate{}, fmt.Errorf("ack: %w", err)
			}
			n++
		case <-timer.C:
			return Rate{N: n, Elapsed: time.Since(start)}, nil
		case <-ctx.Done():
			return Rate{}, ctx.Err()
		}
	}
	return Rate{N: n, Elapsed: time.Since(start)}, nil
}
